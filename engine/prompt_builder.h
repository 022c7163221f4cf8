// Turns a chat (messages with text parts and encoded image bytes) into an engine Prompt: images
// decoded and preprocessed (within limits, per-image pixel bounds), hashed, the chat template
// rendered to ids with image slots, M-RoPE positions computed. CPU work that runs on the caller's
// thread (a server worker, a tool), never on the engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/request.h"
#include "vision/image_decode.h"

namespace iris::engine {

struct ChatInputPart {
  enum class Kind { kText, kImage };
  Kind kind = Kind::kText;
  std::string text;          // kText
  std::string image_bytes;   // kImage: an encoded image (JPEG, PNG, WebP, BMP, TIFF)
  std::optional<int64_t> min_pixels;  // kImage: may only tighten the model's bounds
  std::optional<int64_t> max_pixels;
};

struct ChatInputMessage {
  std::string role;
  std::vector<ChatInputPart> parts;
};

struct PromptLimits {
  int max_images = 16;
  int64_t max_prompt_tokens = 32768;   // image tokens included
  vision::DecodeLimits decode;
};

// INVALID_ARGUMENT naming the field (messages[i].content[j]...) and the limit on bad input.
absl::StatusOr<Prompt> BuildPrompt(const Model& model, const std::vector<ChatInputMessage>& messages,
                                   const PromptLimits& limits = {});

// Reads a chat in the JSON form iris-generate's --messages takes: a list of {"role", "content"}
// where content is a string or a list of {"type":"text","text":…} / {"type":"image","image":PATH}
// parts (paths relative to `base_dir` when not absolute; files are read here).
absl::StatusOr<std::vector<ChatInputMessage>> ParseMessagesJson(const std::string& json,
                                                                const std::string& base_dir);

}  // namespace iris::engine
