// Qwen2.5-VL chat prompts: a list of messages (role + text/image parts) rendered as the checkpoint's
// chat template renders them (chatml with the default system prompt), straight to token ids, with
// each image expanded to its <|image_pad|> slots.
//
// Structural tokens (<|im_start|>, <|im_end|>, <|vision_start|>, <|image_pad|>, <|vision_end|>)
// are inserted as ids. Text is tokenized as the reference tokenizes the rendered prompt, so other
// added tokens typed in text (e.g. "<|im_start|>") still become their ids, as in the reference.
// Text that would produce image/video slot ids (<|image_pad|>, <|video_pad|>, <|vision_start|>,
// <|vision_end|>) is rejected with INVALID_ARGUMENT: image slots come only from image parts, so a
// user cannot break the image-token count (the reference's <|placeholder|> quirk does not exist
// here; a literal "<|placeholder|>" stays ordinary text).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_config.h"
#include "llm/chat_template.h"
#include "llm/tokenizer.h"

namespace iris::llm {

struct ChatPart {
  enum class Kind { kText, kImage };
  Kind kind = Kind::kText;
  std::string text;                       // kText
  std::array<int64_t, 3> grid_thw = {};   // kImage: (t, h, w) in patches, as the preprocessor gives

  static ChatPart Text(std::string s) { return ChatPart{Kind::kText, std::move(s), {}}; }
  static ChatPart Image(std::array<int64_t, 3> thw) { return ChatPart{Kind::kImage, {}, thw}; }
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::vector<ChatPart> parts;
};

inline constexpr char kDefaultSystemPrompt[] = "You are a helpful assistant.";

struct ChatPrompt {
  std::vector<int32_t> ids;
  // Per image part, in order: ids[pad_begin, pad_end) are its <|image_pad|> tokens.
  struct ImageSlot {
    int64_t pad_begin = 0;
    int64_t pad_end = 0;
    std::array<int64_t, 3> grid_thw = {};
  };
  std::vector<ImageSlot> images;
  // The grids in order (for ComputeMropePositions).
  std::vector<std::array<int64_t, 3>> image_grids() const;
};

// Number of <|image_pad|> tokens an image of `grid_thw` takes: t*h*w / merge^2. Fails when h or w
// is not a multiple of the merge size or a dimension is not positive.
absl::StatusOr<int64_t> ImageTokenCount(const std::array<int64_t, 3>& grid_thw, int merge_size);

// Renders `messages` as the Qwen2.5-VL chat template does (add_vision_id off) and tokenizes it.
absl::StatusOr<ChatPrompt> BuildPrompt(const Tokenizer& tokenizer, const core::ModelConfig& config,
                                       const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt = true);

// The same with the checkpoint's ChatStyle (its default system turn). For a text-only model
// (config.has_vision() false) an image part is INVALID_ARGUMENT and no token is reserved: text is
// tokenized as the reference tokenizes it.
absl::StatusOr<ChatPrompt> BuildPrompt(const Tokenizer& tokenizer, const core::ModelConfig& config,
                                       const std::vector<ChatMessage>& messages, const ChatStyle& style,
                                       bool add_generation_prompt = true);

}  // namespace iris::llm
