#include "engine/step_runner.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status_macros.h"
#include "engine/request_state.h"
#include "llm/decoder.h"
#include "llm/mrope.h"
#include "vision/encoder_plan.h"

namespace iris::engine {

using core::Tensor;

StepResult StepRunner::Run(const StepPlan& plan) {
  StepResult result;
  if (!plan.admitted.empty()) EncodeImages(plan, result);
  std::vector<ScheduledWork> work;
  for (const ScheduledWork& w : plan.work) {
    if (result.ran(w)) work.push_back(w);
  }
  if (!work.empty()) {
    absl::StatusOr<Tensor> logits = RunDecoder(work);
    if (logits.ok()) {
      result.logits = std::move(*logits);
    } else {
      result.decoder_status = logits.status();
    }
  }
  return result;
}

void StepRunner::EncodeImages(const StepPlan& plan, StepResult& result) {
  const absl::Time start = absl::Now();
  int64_t images_wanted = 0;
  for (Sequence* seq : plan.admitted) {
    RequestState& s = AsRequest(seq);
    if (s.first_scheduled == absl::InfinitePast()) s.first_scheduled = start;  // queue time ends here
    for (const SequenceImage& im : s.images) images_wanted += s.needs_image(im) ? 1 : 0;
  }
  // Each image the plan encodes is a miss once; every other image wanted is a hit.
  result.encoder_cache_misses = static_cast<int64_t>(plan.images.size());
  result.encoder_cache_hits = images_wanted - result.encoder_cache_misses;

  absl::flat_hash_map<std::string, std::shared_ptr<const Tensor>> fresh;
  absl::Status status;
  if (!plan.images.empty()) {
    const absl::Time t0 = absl::Now();
    auto pixels_of = [](const ImageToEncode& im) -> const PromptImage& {
      return AsRequest(im.source).req.prompt.images[im.index];
    };
    int64_t rows = 0;
    const int64_t width = pixels_of(plan.images[0]).pixel_values->dim(1);
    for (const ImageToEncode& im : plan.images) rows += pixels_of(im).pixel_values->dim(0);
    Tensor pixels = Tensor::Empty(core::DType::kF32, {rows, width});
    std::vector<vision::GridThw> grids;
    int64_t at = 0;
    for (const ImageToEncode& im : plan.images) {
      const PromptImage& p = pixels_of(im);
      std::memcpy(pixels.data<float>() + at * width, p.pixel_values->data<float>(), p.pixel_values->nbytes());
      at += p.pixel_values->dim(0);
      grids.push_back(p.grid_thw);
    }
    absl::StatusOr<Tensor> out = model_->encoder->Forward(pixels, grids);
    if (out.ok()) {
      int64_t row = 0;
      for (const ImageToEncode& im : plan.images) {
        const PromptImage& p = pixels_of(im);
        const int64_t n = p.pad_end - p.pad_begin;
        auto emb = std::make_shared<const Tensor>(out->Rows(row, row + n).Clone());
        row += n;
        encoder_cache_->Insert(im.content_hash, emb);
        fresh[im.content_hash] = std::move(emb);
      }
    } else {
      status = out.status();
    }
    result.images_encoded = static_cast<int64_t>(plan.images.size());
    result.encode_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  }

  // Each admitted sequence takes the embeddings it needs from this batch or from the cache (an
  // image inside its cached prefix has no rows to compute and needs none).
  for (Sequence* seq : plan.admitted) {
    if (!seq->needs_images()) continue;
    RequestState& s = AsRequest(seq);
    s.image_embeds.resize(s.images.size());
    bool in_batch = false, missing = false;
    for (size_t j = 0; j < s.images.size() && !missing; ++j) {
      SequenceImage& im = s.images[j];
      if (!s.needs_image(im)) continue;
      if (auto f = fresh.find(im.content_hash); f != fresh.end()) {
        s.image_embeds[j] = f->second;
        in_batch = true;
      } else if (auto cached = encoder_cache_->Lookup(im.content_hash)) {
        s.image_embeds[j] = std::move(cached);
      } else {
        missing = true;
        continue;
      }
      im.attached = true;
    }
    if (in_batch) s.encode_ms += result.encode_ms;
    if (missing) {
      result.image_errors[seq] = status.ok() ? absl::InternalError("image embeddings missing after encoding") : status;
    }
  }
}

absl::StatusOr<Tensor> StepRunner::RunDecoder(const std::vector<ScheduledWork>& work) {
  llm::Decoder& dec = *model_->decoder;
  const int64_t h = dec.hidden_size();
  const int block_size = cache_->shape().block_size;
  size_t max_blocks = 0;
  for (const ScheduledWork& w : work) max_blocks = std::max(max_blocks, w.seq->table.blocks.size());
  llm::DecoderBatch& batch = batch_;
  batch.Clear(static_cast<int>(max_blocks));
  for (const ScheduledWork& w : work) {
    const RequestState& s = AsRequest(w.seq);
    const int64_t row = batch.num_rows();
    const int64_t begin = w.start, end = begin + w.num_tokens;
    batch.token_ids.insert(batch.token_ids.end(), s.tokens.begin() + begin, s.tokens.begin() + end);
    const Prompt& p = s.req.prompt;
    for (size_t j = 0; j < p.images.size(); ++j) {
      const int64_t lo = std::max(begin, p.images[j].pad_begin), hi = std::min(end, p.images[j].pad_end);
      if (lo >= hi) continue;
      if (j >= s.image_embeds.size() || s.image_embeds[j] == nullptr) {
        return absl::InternalError(
            absl::StrCat("request ", s.id, ": image ", j, " has rows to compute but no embeddings"));
      }
      const float* src = s.image_embeds[j]->data<float>() + (lo - p.images[j].pad_begin) * h;
      for (int64_t i = lo; i < hi; ++i) batch.embed_rows.push_back(static_cast<int32_t>(row + i - begin));
      batch.embeds.insert(batch.embeds.end(), src, src + (hi - lo) * h);
    }
    for (int64_t i = begin; i < end; ++i) {
      for (int a = 0; a < 3; ++a) {
        batch.positions[a].push_back(i < s.prompt_len ? p.positions.positions[a][i]
                                                       : llm::DecodePosition(s.prompt_len, i - s.prompt_len,
                                                                             p.positions.rope_delta));
      }
    }
    IRIS_RETURN_IF_ERROR(batch.AddSequence(s.table, block_size, w.num_tokens, w.samples));
  }
  return dec.Forward(batch, cache_);
}

}  // namespace iris::engine
