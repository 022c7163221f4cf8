// What the engine takes in (a prepared prompt, its images, sampling parameters, a callback) and
// what it streams back (new token ids and text, then a final message with finish reason, usage
// and server-side timings).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor.h"
#include "llm/mrope.h"
#include "llm/sampler.h"

namespace iris::engine {

// One preprocessed image of a prompt.
struct PromptImage {
  // U8 [grid h * P, grid w * P, 3]: the image resized to its grid (vision::Preprocess); the
  // encoder makes its pixel values where it runs.
  std::shared_ptr<const core::Tensor> rgb;
  std::array<int64_t, 3> grid_thw = {};
  std::string content_hash;  // SHA-256 of the resized image's bytes and grid (hex): the encoder cache key
  int64_t pad_begin = 0;     // prompt_ids[pad_begin, pad_end) are its <|image_pad|> tokens
  int64_t pad_end = 0;
};

// A prompt ready for the engine: token ids with image slots expanded and M-RoPE positions.
struct Prompt {
  std::vector<int32_t> ids;
  std::vector<PromptImage> images;
  llm::MropePositions positions;
  int64_t num_image_tokens() const;
};

struct Usage {
  int64_t prompt_tokens = 0;      // including image tokens
  int64_t image_tokens = 0;
  int64_t completion_tokens = 0;
};

// Server-side timings of one request, in milliseconds from its arrival at the engine.
struct Timings {
  double queue_ms = 0;        // arrival → first scheduled (encode or prefill)
  double encode_ms = 0;       // time spent in encoder forwards that included its images
  double prefill_ms = 0;      // first scheduled → prompt fully computed
  double first_token_ms = 0;  // arrival → first token sampled
  double total_ms = 0;        // arrival → finished
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> token_ids;  // ids generated since the previous output
  std::string text;                // text completed since the previous output (valid UTF-8)
  bool finished = false;
  llm::FinishReason finish_reason = llm::FinishReason::kNone;
  absl::Status status;             // non-OK with finish_reason kError
  Usage usage;                     // final output only
  Timings timings;                 // final output only
  std::vector<float> prompt_logits;  // first output only, when Request::capture_prompt_logits
};

// Called on the engine thread; must return quickly (hand the output to another thread).
using OutputCallback = std::function<void(RequestOutput)>;

struct Request {
  std::string id;  // unique among requests in flight
  Prompt prompt;
  llm::SamplingParams sampling;
  bool skip_special_tokens = true;
  // Also report the logits at the last prompt position (float32 [vocab]; for checking tools).
  bool capture_prompt_logits = false;
  OutputCallback on_output;
};

}  // namespace iris::engine
