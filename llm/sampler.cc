#include "llm/sampler.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "kernels/logit_scan.h"
#include "kernels/ordered_float_key.h"
#include "kernels/rows.h"

namespace iris::llm {
namespace {

using kernels::Exp;
using kernels::ExpShiftedRow;
using kernels::kLogitChunk;
using kernels::NanAsNegInf;
using kernels::RowMax;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Larger value first; the lower id first among equal values (a total order, so results do not
// depend on the sort algorithm).
bool Before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// The first index of the largest value; NaN never wins. 0 when every value is NaN or -inf. The
// op a device runs for greedy picks (DecoderBatch::picks_only), so both paths pick by one rule.
int32_t Argmax(const float* logits, int64_t vocab) {
  int32_t id = 0;
  kernels::ArgmaxRows(kernels::DefaultCpuDevice(), logits, 1, vocab, &id);
  return id;
}

// The largest 32-bit key v such that the weight of the items with key >= v reaches `need`
// (0 when even all of them fall short), in two passes of 16-bit histograms: O(n), no sort.
template <typename W, typename KeyFn, typename WeightFn>
uint32_t RadixSelect(int64_t n, KeyFn key, WeightFn weight, W need, std::vector<W>& hist) {
  constexpr uint32_t kTop = 0xFFFF;
  W above = 0;  // weight of the keys above the current bucket
  uint32_t high = 0;
  for (int level = 0; level < 2; ++level) {
    hist.assign(size_t{kTop} + 1, W{0});
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t k = key(i);
      if (level == 0) {
        hist[k >> 16] += weight(i);
      } else if ((k >> 16) == high) {
        hist[k & kTop] += weight(i);
      }
    }
    uint32_t b = kTop;
    for (;; --b) {
      if (above + hist[b] >= need || b == 0) break;
      above += hist[b];
    }
    if (level == 0) {
      high = b;
    } else {
      return (high << 16) | b;
    }
  }
  return 0;
}

// Top-k up to this size selects with a heap in one pass; larger k with histograms.
constexpr int64_t kMaxHeapTopK = 1024;

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.f && temperature <= 100.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be in [0, 100], got ", temperature, " (0 = greedy)"));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k, " (0 = off)"));
  }
  if (!(top_p > 0.f && top_p <= 1.f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p, " (1 = off)"));
  }
  if (!(repetition_penalty > 0.f && repetition_penalty <= 10.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be in (0, 10], got ", repetition_penalty, " (1 = off)"));
  }
  if (max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens));
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids[", i, "] must be >= 0, got ", stop_token_ids[i]));
    }
  }
  if (stop_strings.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat("stop_strings: at most ", kMaxStopStrings,
                                                   " stop strings are allowed, got ", stop_strings.size()));
  }
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop_strings[", i, "] must not be empty"));
    }
    if (stop_strings[i].size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop_strings[", i, "] must be at most ",
                                                     kMaxStopStringBytes, " bytes, got ",
                                                     stop_strings[i].size()));
    }
  }
  return absl::OkStatus();
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "";
}

// ---- Sampler ----

Sampler::Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt_ids, absl::Span<const int32_t> eos_ids)
    : params_(params) {
  if (params_.min_tokens > 0) {
    masked_before_min_ = params_.stop_token_ids;
    if (!params_.ignore_eos) masked_before_min_.insert(masked_before_min_.end(), eos_ids.begin(), eos_ids.end());
  }
  if (params_.seed.has_value()) {
    rng_.seed(*params_.seed);
  } else {
    std::random_device rd;
    const uint64_t hi = rd(), lo = rd();
    rng_.seed((hi << 32) ^ lo);
  }
  if (params_.repetition_penalty != 1.f) seen_.insert(prompt_ids.begin(), prompt_ids.end());
}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::AddEdits(kernels::LogitEdits& edits) const {
  std::vector<int32_t> seen;
  if (params_.repetition_penalty != 1.f) seen.assign(seen_.begin(), seen_.end());
  const bool masking = generated_ < params_.min_tokens;
  edits.AddRow(params_.repetition_penalty, seen, masking ? absl::Span<const int32_t>(masked_before_min_)
                                                         : absl::Span<const int32_t>());
}

kernels::RowDraw Sampler::NextDraw() {
  kernels::RowDraw d;  // greedy: temperature 0, and no uniform drawn (Sample draws none either)
  if (!params_.greedy()) {
    d.temperature = params_.temperature;
    d.top_k = params_.top_k;
    d.top_p = params_.top_p;
    d.uniform = Uniform();
  }
  return d;
}

void Sampler::Accept(int32_t id) {
  ++generated_;
  if (params_.repetition_penalty != 1.f) seen_.insert(id);
}

int32_t Sampler::Sample(float* logits, int64_t vocab) {
  assert(vocab > 0);
  if (generated_++ < params_.min_tokens) {
    for (const int32_t id : masked_before_min_) {
      if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
    }
  }
  const float penalty = params_.repetition_penalty;
  if (penalty != 1.f) {
    // HF RepetitionPenaltyLogitsProcessor: each id once, however often it occurred.
    for (const int32_t id : seen_) {
      if (id < 0 || id >= vocab) continue;
      float& s = logits[id];
      s = s < 0.f ? s * penalty : s / penalty;
    }
  }
  int32_t token;
  if (params_.greedy()) {
    token = Argmax(logits, vocab);
  } else {
    // Drawn first, whatever the row holds: the generator advances by one per sampled pick, as
    // where a device draws it (NextDraw).
    const double u = Uniform();
    const float t = params_.temperature;
    for (int64_t i = 0; i < vocab; ++i) logits[i] /= t;
    token = SampleFiltered(logits, vocab, u);
  }
  if (penalty != 1.f) seen_.insert(token);
  return token;
}

int32_t Sampler::SampleFiltered(const float* logits, int64_t vocab, double u) {
  const float max_value = RowMax(logits, vocab);
  // Degenerate rows: all -inf/NaN (nothing to draw from) or some +inf (all the mass there).
  if (max_value == kNegInf || max_value == kPosInf) return Argmax(logits, vocab);

  const bool use_top_p = params_.top_p < 1.f;
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, vocab) : vocab;

  // `scratch_` ends up holding the candidates (unnormalized probability, id) to draw from, in
  // the order the draw walks them.
  scratch_.clear();
  if (k < vocab) {
    // The k-th largest logit, exactly, in O(vocab). HF and vLLM mask only values below it, so
    // ties with it stay.
    const float kth = KthLargest(logits, vocab, k);
    for (int64_t begin = 0; begin < vocab; begin += kLogitChunk) {
      const int64_t end = std::min(begin + kLogitChunk, vocab);
      if (RowMax(logits + begin, end - begin) < kth) continue;  // no candidate in this chunk
      for (int64_t i = begin; i < end; ++i) {
        const float v = NanAsNegInf(logits[i]);
        if (v >= kth) scratch_.emplace_back(Exp(v - max_value), static_cast<int32_t>(i));
      }
    }
    if (use_top_p) {
      std::sort(scratch_.begin(), scratch_.end(), Before);
      KeepNucleus(0, 0.0);
    }
  } else {
    probs_.resize(static_cast<size_t>(vocab));
    const double total = ExpShiftedRow(logits, vocab, max_value, probs_.data(), chunk_mass_);
    if (!use_top_p) return DrawInIdOrder(vocab, total, u);
    const double need = NucleusMass(total);
    // Usually the nucleus is a few likely tokens: those with p >= 2^-10 (relative to the most
    // likely) are a prefix of the descending order, so once they carry the mass, sorting them
    // is enough.
    constexpr float kLikely = 0x1.0p-10f;
    constexpr size_t kMaxLikely = 4096;
    double likely_mass = 0.0;
    for (int64_t begin = 0; begin < vocab && scratch_.size() <= kMaxLikely; begin += kLogitChunk) {
      const int64_t end = std::min(begin + kLogitChunk, vocab);
      if (RowMax(probs_.data() + begin, end - begin) < kLikely) continue;
      for (int64_t i = begin; i < end && scratch_.size() <= kMaxLikely; ++i) {
        if (probs_[i] >= kLikely) {
          scratch_.emplace_back(probs_[i], static_cast<int32_t>(i));
          likely_mass += probs_[i];
        }
      }
    }
    if (scratch_.size() <= kMaxLikely && likely_mass >= need) {
      std::sort(scratch_.begin(), scratch_.end(), Before);
      KeepNucleus(0, total);
    } else {
      // A flat distribution: find the probability of the nucleus's last token by mass, without
      // sorting. Tokens above it are in the nucleus whatever their order; tokens equal to it
      // follow in id order (the descending order's tie rule) until the mass reaches top_p.
      const auto key = [this](int64_t i) { return std::bit_cast<uint32_t>(probs_[i]); };
      const uint32_t last = RadixSelect<double>(
          vocab, key, [this](int64_t i) { return static_cast<double>(probs_[i]); }, need, mass_);
      return DrawAboveAndTies(vocab, std::bit_cast<float>(last), need, u);
    }
  }

  if (use_top_p) {
    // The draw's order (kernels/sample_rows.h): the nucleus's tokens above its last value in id
    // order, then those equal to it in id order.
    const float last = scratch_.back().first;
    std::sort(scratch_.begin(), scratch_.end(), [last](const auto& a, const auto& b) {
      return (a.first == last) < (b.first == last) || ((a.first == last) == (b.first == last) && a.second < b.second);
    });
  }
  double total = 0.0;
  for (const auto& c : scratch_) total += c.first;
  const double target = u * total;
  double cum = 0.0;
  int32_t last_nonzero = scratch_.front().second;
  for (const auto& c : scratch_) {
    if (c.first == 0.f) continue;
    cum += c.first;
    last_nonzero = c.second;
    if (target < cum) return c.second;
  }
  return last_nonzero;  // only when rounding put the target at the very end
}

int64_t Sampler::WalkAbove(int64_t vocab, float floor, double target, double& cum) const {
  for (size_t c = 0; c < chunk_mass_.size(); ++c) {
    if (cum + chunk_mass_[c] <= target) {  // the target lies past this chunk: step over it
      cum += chunk_mass_[c];
      continue;
    }
    const int64_t begin = static_cast<int64_t>(c) * kLogitChunk;
    for (int64_t i = begin; i < std::min(vocab, begin + kLogitChunk); ++i) {
      if (!(probs_[i] > floor)) continue;
      cum += probs_[i];
      if (target < cum) return i;
    }
  }
  return -1;
}

int32_t Sampler::LastAbove(int64_t vocab, float floor) const {
  for (int64_t i = vocab - 1; i > 0; --i) {
    if (probs_[i] > floor) return static_cast<int32_t>(i);
  }
  return 0;
}

int32_t Sampler::DrawAboveAndTies(int64_t vocab, float last, double need, double u) {
  // The nucleus: every token above `last`, then the tokens equal to it in id order until the
  // mass reaches `need` (KeepNucleus's rule; all of them if it never does). The draw walks it in
  // that order without listing it: the tokens above by chunks, then the ties.
  int64_t tie_count = 0;
  double nucleus = kernels::MassAbove(probs_.data(), vocab, last, chunk_mass_, &tie_count);
  int64_t ties = 0;
  for (; ties < tie_count && nucleus < need; ++ties) nucleus += last;
  const double target = u * nucleus;
  double cum = 0.0;
  if (const int64_t i = WalkAbove(vocab, last, target, cum); i >= 0) return static_cast<int32_t>(i);
  int64_t last_tie = -1;
  for (int64_t i = 0, seen = 0; i < vocab && seen < ties && last > 0.f; ++i) {
    if (probs_[i] != last) continue;
    ++seen;
    cum += last;
    last_tie = i;
    if (target < cum) return static_cast<int32_t>(i);
  }
  // Only when rounding put the target at the very end: the walk's last token that can be drawn.
  return last_tie >= 0 ? static_cast<int32_t>(last_tie) : LastAbove(vocab, last);
}

int32_t Sampler::DrawInIdOrder(int64_t vocab, double total, double u) {
  // The tokens that can be drawn are those above 0, and ExpShiftedRow's chunk sums are their
  // mass by chunk: the walk of DrawAboveAndTies with no ties.
  const double target = u * total;
  double cum = 0.0;
  const int64_t i = WalkAbove(vocab, 0.f, target, cum);
  return i >= 0 ? static_cast<int32_t>(i) : LastAbove(vocab, 0.f);
}

float Sampler::KthLargest(const float* logits, int64_t vocab, int64_t k) {
  if (k <= kMaxHeapTopK) {
    // One pass with a heap of the best k so far (worst on top): for logits in no particular
    // order only a few hundred tokens ever enter it.
    scratch_.clear();
    for (int64_t begin = 0; begin < vocab; begin += kLogitChunk) {
      const int64_t end = std::min(begin + kLogitChunk, vocab);
      // A full heap takes only values above its worst: a chunk whose largest is not skips whole.
      if (static_cast<int64_t>(scratch_.size()) == k && !(RowMax(logits + begin, end - begin) > scratch_.front().first)) {
        continue;
      }
      for (int64_t i = begin; i < end; ++i) {
        const float v = NanAsNegInf(logits[i]);
        if (static_cast<int64_t>(scratch_.size()) < k) {
          scratch_.emplace_back(v, static_cast<int32_t>(i));
          std::push_heap(scratch_.begin(), scratch_.end(), Before);
        } else if (v > scratch_.front().first) {
          std::pop_heap(scratch_.begin(), scratch_.end(), Before);
          scratch_.back() = {v, static_cast<int32_t>(i)};
          std::push_heap(scratch_.begin(), scratch_.end(), Before);
        }
      }
    }
    const float kth = scratch_.front().first;
    scratch_.clear();
    return kth;
  }
  const uint32_t key = RadixSelect<int64_t>(
      vocab, [logits](int64_t i) { return kernels::OrderedFloatKey(NanAsNegInf(logits[i])); },
      [](int64_t) { return int64_t{1}; }, k, counts_);
  return kernels::FromOrderedFloatKey(key);
}

double Sampler::NucleusMass(double total) const {
  return kernels::NucleusNeed(params_.top_p, total);
}

void Sampler::KeepNucleus(size_t always, double total) {
  if (total <= 0.0) {
    for (const auto& c : scratch_) total += c.first;
  }
  const double need = NucleusMass(total);
  double cum = 0.0;
  for (size_t i = 0; i < scratch_.size(); ++i) {
    cum += scratch_[i].first;
    if (i + 1 >= always && cum >= need) {
      scratch_.resize(std::max<size_t>(i + 1, 1));
      return;
    }
  }
}

// ---- StopChecker ----

StopChecker::StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids)
    : params_(params), eos_ids_(std::move(eos_ids)) {}

StopChecker::Step StopChecker::Push(int32_t id, std::string_view text, int64_t num_generated) {
  Step step;
  const bool stop_id =
      std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), id) != params_.stop_token_ids.end() ||
      (!params_.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end());
  if (stop_id && num_generated > params_.min_tokens) {
    // The stop token's own text is dropped; a held-back partial stop string can no longer
    // complete, so it is ordinary text now.
    step.text = std::move(held_);
    held_.clear();
    step.finish = FinishReason::kStop;
    return step;
  }

  std::string buf = std::move(held_);
  held_.clear();
  buf.append(text);

  // `buf` never has a whole stop string before the new text (it would have stopped), and what was
  // emitted earlier cannot start one (the longest candidate suffix was held), so a search in
  // `buf` finds every match. The earliest wins; among equal starts, the first listed.
  size_t best_pos = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : params_.stop_strings) {
    if (s.empty() || num_generated < params_.min_tokens) continue;
    const size_t pos = buf.find(s);
    if (pos != std::string::npos && (best == nullptr || pos < best_pos)) {
      best_pos = pos;
      best = &s;
    }
  }
  if (best != nullptr) {
    buf.resize(best_pos);
    step.text = std::move(buf);
    step.finish = FinishReason::kStop;
    step.matched_stop = *best;
    return step;
  }

  if (num_generated >= params_.max_tokens) {
    step.text = std::move(buf);
    step.finish = FinishReason::kLength;
    return step;
  }

  // Hold back the longest suffix of `buf` that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : params_.stop_strings) {
    for (size_t len = std::min(s.size() - (s.empty() ? 0 : 1), buf.size()); len > hold; --len) {
      if (buf.compare(buf.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  held_.assign(buf, buf.size() - hold, hold);
  buf.resize(buf.size() - hold);
  step.text = std::move(buf);
  return step;
}

std::string StopChecker::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace iris::llm
