#include "engine/step_runner.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
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

// An encode job in flight: its images (content hash, merged-token rows, the ids of the waiting
// sequences it is for) and its time so far.
struct StepRunner::EncodeJob {
  struct Image {
    std::string content_hash;
    std::vector<std::string> sequences;
  };
  std::vector<Image> images;
  Tensor rgb;  // the images' bytes, kept alive while the encoder reads them
  double ms = 0;
};

StepRunner::StepRunner(Model* model, llm::KvCache* cache, EncoderCache* encoder_cache, const Scheduler* scheduler,
                       bool interleave_encoder, EncoderWorker* worker, bool sample_on_device)
    : model_(model), cache_(cache), encoder_cache_(encoder_cache), scheduler_(scheduler),
      interleave_encoder_(interleave_encoder), sample_on_device_(sample_on_device), worker_(worker) {}

StepRunner::~StepRunner() {
  if (job_ != nullptr) StopJobWork();
}

void StepRunner::StopJobWork() {
  if (worker_ != nullptr) {
    worker_->Abandon();
  } else {
    model_->encoder->Abandon();
  }
}

StepResult StepRunner::Run(const StepPlan& plan, double encoder_flops) {
  StepResult result;
  if (encode_jobs()) {
    // Admitted sequences' images are attached already or all cached (the scheduler checked): taken
    // before the job below can insert (and evict) anything.
    AttachAdmitted(plan, {}, 0, absl::OkStatus(), result);
    if (!plan.images.empty()) StartJob(plan, result);
    if (job_ != nullptr) AdvanceJob(encoder_flops, result);
  } else if (!plan.admitted.empty()) {
    EncodeImages(plan, result);
  }
  std::vector<ScheduledWork> work;
  for (const ScheduledWork& w : plan.work) {
    if (result.ran(w)) work.push_back(w);
  }
  if (!work.empty()) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<Tensor> logits = RunDecoder(work);
    result.decoder_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
    for (const ScheduledWork& w : work) {
      result.decoder_rows += w.num_tokens;
      result.decoder_logit_rows += w.samples ? 1 : 0;
    }
    if (logits.ok()) {
      result.logits = std::move(*logits);
    } else {
      result.decoder_status = logits.status();
    }
  }
  return result;
}

void StepRunner::GatherRgb(const std::vector<ImageToEncode>& images, Tensor* rgb, std::vector<vision::GridThw>* grids) {
  auto image_of = [](const ImageToEncode& im) -> const PromptImage& {
    return AsRequest(im.source).req.prompt.images[im.index];
  };
  int64_t bytes = 0;
  for (const ImageToEncode& im : images) bytes += image_of(im).rgb->nbytes();
  *rgb = Tensor::Empty(core::DType::kU8, {bytes});
  grids->clear();
  int64_t at = 0;
  for (const ImageToEncode& im : images) {
    const PromptImage& p = image_of(im);
    std::memcpy(rgb->data<uint8_t>() + at, p.rgb->data<uint8_t>(), p.rgb->nbytes());
    at += p.rgb->nbytes();
    grids->push_back(p.grid_thw);
  }
}

void StepRunner::EncodeImages(const StepPlan& plan, StepResult& result) {
  Embeddings fresh;
  absl::Status status;
  if (!plan.images.empty()) {
    const absl::Time t0 = absl::Now();
    Tensor rgb;
    std::vector<vision::GridThw> grids;
    GatherRgb(plan.images, &rgb, &grids);
    vision::VisionEncoder& encoder = *model_->encoder;
    status = encoder.BeginRgb(rgb, grids, model_->pixel_normalization());
    if (status.ok()) status = encoder.AdvanceToEnd();
    absl::StatusOr<std::vector<Tensor>> out = status.ok() ? encoder.FinishImages() : status;
    if (out.ok()) {
      for (size_t i = 0; i < plan.images.size(); ++i) {
        StoreEmbeddings(std::move((*out)[i]), plan.images[i].content_hash, fresh);
      }
    } else {
      status = out.status();
    }
    result.images_encoded = static_cast<int64_t>(plan.images.size());
    result.encode_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  }
  // Each image the plan encodes is a miss once; every other image an admitted sequence wants is a hit.
  result.encoder_cache_misses = static_cast<int64_t>(plan.images.size());
  AttachAdmitted(plan, fresh, result.encode_ms, status, result);
  result.encoder_cache_hits -= result.encoder_cache_misses;
}

void StepRunner::StoreEmbeddings(Tensor image, const std::string& content_hash, Embeddings& fresh) {
  auto emb = std::make_shared<const Tensor>(std::move(image));
  encoder_cache_->Insert(content_hash, emb);
  fresh[content_hash] = std::move(emb);
}

StepRunner::Attached StepRunner::AttachImages(RequestState& s, const Embeddings& fresh) {
  Attached a;
  s.image_embeds.resize(s.images.size());
  for (size_t j = 0; j < s.images.size(); ++j) {
    SequenceImage& im = s.images[j];
    if (!s.needs_image(im)) continue;
    ++a.needed;
    if (auto f = fresh.find(im.content_hash); f != fresh.end()) {
      s.image_embeds[j] = f->second;
      a.from_fresh = true;
    } else if (auto cached = encoder_cache_->Lookup(im.content_hash)) {
      s.image_embeds[j] = std::move(cached);
    } else {
      continue;
    }
    im.attached = true;
    ++a.attached;
  }
  return a;
}

void StepRunner::AttachAdmitted(const StepPlan& plan,
                                const Embeddings& fresh, double encode_ms, const absl::Status& status, StepResult& result) {
  const absl::Time start = absl::Now();
  // Each admitted sequence takes the embeddings it needs from this batch or from the cache (an
  // image inside its cached prefix has no rows to compute and needs none).
  for (Sequence* seq : plan.admitted) {
    RequestState& s = AsRequest(seq);
    if (s.first_scheduled == absl::InfinitePast()) s.first_scheduled = start;  // queue time ends here
    if (!s.needs_images()) continue;
    const Attached a = AttachImages(s, fresh);
    result.encoder_cache_hits += a.needed;
    if (a.from_fresh) s.encode_ms += encode_ms;
    if (a.attached < a.needed) {
      result.image_errors[seq] = status.ok() ? absl::InternalError("image embeddings missing after encoding") : status;
    }
  }
}

void StepRunner::StartJob(const StepPlan& plan, StepResult& result) {
  auto job = std::make_unique<EncodeJob>();
  for (const ImageToEncode& im : plan.images) {
    EncodeJob::Image image{im.content_hash, {}};
    for (const Sequence* seq : im.sequences) image.sequences.push_back(seq->id);
    job->images.push_back(std::move(image));
  }
  std::vector<vision::GridThw> grids;
  GatherRgb(plan.images, &job->rgb, &grids);
  job_ = std::move(job);
  result.encoder_cache_misses += static_cast<int64_t>(plan.images.size());
  // On the worker the bytes go with the job; here the encoder reads them until the job ends.
  const absl::Status begun =
      worker_ != nullptr ? worker_->Submit(std::move(job_->rgb), std::move(grids), model_->pixel_normalization())
                         : model_->encoder->BeginRgb(job_->rgb, grids, model_->pixel_normalization());
  if (!begun.ok()) EndJob(begun, result);
}

void StepRunner::AdvanceJob(double encoder_flops, StepResult& result) {
  // Abandoned when every sequence it was for has finished (cancelled, failed).
  bool wanted = false;
  for (const EncodeJob::Image& im : job_->images) {
    for (const std::string& id : im.sequences) wanted = wanted || scheduler_->Find(id) != nullptr;
  }
  if (!wanted) {
    StopJobWork();
    job_.reset();
    result.encode_job_ended = true;
    return;
  }
  if (worker_ != nullptr) {  // it runs on its own: only its end is news
    if (std::optional<EncoderWorker::Result> done = worker_->Poll()) {
      job_->ms = done->ms;
      EndJob(std::move(done->images), result);
    }
    return;
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<double> ran = model_->encoder->Advance(encoder_flops);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  job_->ms += ms;
  if (!ran.ok()) {
    model_->encoder->Abandon();
    EndJob(ran.status(), result);
    return;
  }
  result.encoder_flops = *ran;
  result.encoder_slice_ms = ms;
  if (model_->encoder->done()) {
    const absl::Time t1 = absl::Now();
    absl::StatusOr<std::vector<Tensor>> out = model_->encoder->FinishImages();
    job_->ms += absl::ToDoubleMilliseconds(absl::Now() - t1);
    EndJob(std::move(out), result);
  }
}

void StepRunner::EndJob(absl::StatusOr<std::vector<Tensor>> out, StepResult& result) {
  std::unique_ptr<EncodeJob> job = std::move(job_);
  result.encode_job_ended = true;
  absl::Status failed = out.status();
  Embeddings fresh;
  if (failed.ok() && out->size() != job->images.size()) {
    failed = absl::InternalError(absl::StrCat("the encoder gave ", out->size(), " images' embeddings for ",
                                              job->images.size()));
  }
  if (failed.ok()) {
    for (size_t i = 0; i < job->images.size(); ++i) StoreEmbeddings(std::move((*out)[i]), job->images[i].content_hash, fresh);
    result.images_encoded = static_cast<int64_t>(job->images.size());
    result.encode_ms = job->ms;
  }
  // The waiting sequences it was for get their embeddings now (so that nothing the cache evicts
  // meanwhile is lost), or the error.
  std::vector<std::string> ids;
  for (const EncodeJob::Image& im : job->images) {
    for (const std::string& id : im.sequences) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
  }
  int64_t attached = 0;
  for (const std::string& id : ids) {
    Sequence* seq = scheduler_->Find(id);
    if (seq == nullptr || !seq->needs_images()) continue;
    if (!failed.ok()) {
      result.job_errors.emplace_back(id, failed);
      continue;
    }
    // Each image it needs, from this job or the cache; one evicted meanwhile stays unattached and
    // the scheduler plans it again.
    RequestState& s = AsRequest(seq);
    attached += AttachImages(s, fresh).attached;
    s.encode_ms += job->ms;
  }
  if (failed.ok()) result.encoder_cache_hits += std::max<int64_t>(0, attached - result.images_encoded);
}

absl::StatusOr<Tensor> StepRunner::RunDecoder(const std::vector<ScheduledWork>& work) {
  llm::Decoder& dec = *model_->decoder;
  const int64_t h = dec.hidden_size();
  const int block_size = cache_->shape().block_size;
  size_t max_blocks = 0;
  for (const ScheduledWork& w : work) max_blocks = std::max(max_blocks, w.seq->table.blocks.size());
  llm::DecoderBatch& batch = batch_;
  batch.Clear(static_cast<int>(max_blocks));
  std::vector<RequestState*> sampling;  // the work that samples, in row order
  bool picks_where_logits_are = true;
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
    if (w.samples) {
      sampling.push_back(&AsRequest(w.seq));
      picks_where_logits_are = picks_where_logits_are && s.PicksWhereLogitsAre(sample_on_device_);
    }
  }
  // Every row picked where the logits are (on a GPU, one int per row comes back instead of the
  // vocabulary's floats): the rows' penalties and masks, then the argmax, or with a sampled row
  // among them every row's draw (a greedy row's is its argmax). Only then do the samplers give
  // their draws: each draw takes a uniform from its request's generator.
  batch.picks_only = picks_where_logits_are && !sampling.empty();
  if (batch.picks_only) {
    bool any_sampled = false;
    for (RequestState* s : sampling) {
      s->sampler->AddEdits(batch.logit_edits);
      any_sampled = any_sampled || !s->sampler->PicksByArgmax();
    }
    if (any_sampled) {
      for (RequestState* s : sampling) batch.draws.push_back(s->sampler->NextDraw());
    }
  }
  return dec.Forward(batch, cache_);
}

}  // namespace iris::engine
