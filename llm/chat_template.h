// What iris takes from a checkpoint's Jinja chat template. iris renders ChatML itself (as ids, see
// chat_format.h); the one thing that differs between the Qwen templates it serves is the system
// turn inserted when the first message is not a system message: "You are a helpful assistant."
// in the VL templates, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." in
// Qwen2.5-Instruct's text template, none in some others. That literal is read from the template.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace iris::llm {

struct ChatStyle {
  // The default system turn's content; nullopt: the template inserts none.
  std::optional<std::string> default_system_prompt = std::string("You are a helpful assistant.");
};

// The style of a ChatML template: the first literal `<|im_start|>system\n…<|im_end|>` whose
// content is plain text (not an expression) is the default system prompt. INVALID_ARGUMENT for a
// template that is not ChatML (no <|im_start|>), which iris cannot render.
absl::StatusOr<ChatStyle> ChatStyleFromTemplate(std::string_view jinja);

// The template of a checkpoint folder: chat_template.json's "chat_template" (the VL processors'
// file) if present, else tokenizer_config.json's (a string, or the entry named "default" of a
// list). The default ChatStyle when neither has one. Errors name the file.
absl::StatusOr<ChatStyle> LoadChatStyle(const std::string& dir);

}  // namespace iris::llm
