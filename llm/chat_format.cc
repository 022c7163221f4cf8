#include "llm/chat_format.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace iris::llm {
namespace {

// Accumulates the prompt: text runs are tokenized as a whole between structural ids.
class PromptWriter {
 public:
  PromptWriter(const Tokenizer& tokenizer, std::vector<int32_t> forbidden)
      : tokenizer_(tokenizer), forbidden_(std::move(forbidden)) {}

  void Text(std::string_view s) { pending_.append(s.data(), s.size()); }

  absl::Status Id(int32_t id) {
    absl::Status st = Flush();
    if (!st.ok()) return st;
    ids_.push_back(id);
    return absl::OkStatus();
  }

  absl::Status Flush() {
    if (pending_.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_.Encode(pending_);
    if (!ids.ok()) return ids.status();
    for (int32_t id : *ids) {
      for (int32_t f : forbidden_) {
        if (id == f) {
          auto piece = tokenizer_.IdToToken(id);
          return absl::InvalidArgumentError(absl::StrCat(
              "chat text contains the reserved token ", piece.ok() ? *piece : std::string("?"), " (id ", id,
              "); image and video slots come only from image parts"));
        }
      }
    }
    ids_.insert(ids_.end(), ids->begin(), ids->end());
    pending_.clear();
    return absl::OkStatus();
  }

  int64_t size() const { return static_cast<int64_t>(ids_.size()); }
  std::vector<int32_t> Take() { return std::move(ids_); }

 private:
  const Tokenizer& tokenizer_;
  std::vector<int32_t> forbidden_;
  std::string pending_;
  std::vector<int32_t> ids_;
};

absl::StatusOr<int32_t> RequireToken(const Tokenizer& tokenizer, const char* content) {
  std::optional<int32_t> id = tokenizer.TokenToId(content);
  if (!id.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("tokenizer has no ", content, " token"));
  }
  return *id;
}

}  // namespace

std::vector<std::array<int64_t, 3>> ChatPrompt::image_grids() const {
  std::vector<std::array<int64_t, 3>> grids;
  grids.reserve(images.size());
  for (const ImageSlot& s : images) grids.push_back(s.grid_thw);
  return grids;
}

absl::StatusOr<int64_t> ImageTokenCount(const std::array<int64_t, 3>& grid_thw, int merge_size) {
  const int64_t t = grid_thw[0], h = grid_thw[1], w = grid_thw[2];
  if (merge_size <= 0) return absl::InvalidArgumentError("spatial merge size must be positive");
  if (t <= 0 || h <= 0 || w <= 0 || h % merge_size != 0 || w % merge_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("image grid_thw (", t, ", ", h, ", ", w,
                                                   ") is not positive with h and w multiples of ", merge_size));
  }
  return t * h * w / (static_cast<int64_t>(merge_size) * merge_size);
}

absl::StatusOr<ChatPrompt> BuildPrompt(const Tokenizer& tokenizer, const core::ModelConfig& config,
                                       const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  return BuildPrompt(tokenizer, config, messages, ChatStyle{}, add_generation_prompt);
}

absl::StatusOr<ChatPrompt> BuildPrompt(const Tokenizer& tokenizer, const core::ModelConfig& config,
                                       const std::vector<ChatMessage>& messages, const ChatStyle& style,
                                       bool add_generation_prompt) {
  IRIS_ASSIGN_OR_RETURN(const int32_t im_start, RequireToken(tokenizer, "<|im_start|>"));
  IRIS_ASSIGN_OR_RETURN(const int32_t im_end, RequireToken(tokenizer, "<|im_end|>"));
  const auto image_pad = static_cast<int32_t>(config.image_token_id);
  const auto vision_start = static_cast<int32_t>(config.vision_start_token_id);
  const auto vision_end = static_cast<int32_t>(config.vision_end_token_id);
  const auto video_pad = static_cast<int32_t>(config.video_token_id);
  const int merge = config.vision.spatial_merge_size;

  std::vector<int32_t> reserved;
  if (config.has_vision()) reserved = {image_pad, video_pad, vision_start, vision_end};
  PromptWriter w(tokenizer, std::move(reserved));
  ChatPrompt prompt;

  auto header = [&](std::string_view role) -> absl::Status {
    IRIS_RETURN_IF_ERROR(w.Id(im_start));
    w.Text(role);
    w.Text("\n");
    return absl::OkStatus();
  };
  auto footer = [&]() -> absl::Status {
    IRIS_RETURN_IF_ERROR(w.Id(im_end));
    w.Text("\n");
    return absl::OkStatus();
  };

  for (size_t m = 0; m < messages.size(); ++m) {
    const ChatMessage& msg = messages[m];
    if (m == 0 && msg.role != "system" && style.default_system_prompt.has_value()) {
      IRIS_RETURN_IF_ERROR(header("system"));
      w.Text(*style.default_system_prompt);
      IRIS_RETURN_IF_ERROR(footer());
    }
    IRIS_RETURN_IF_ERROR(header(msg.role));
    for (size_t p = 0; p < msg.parts.size(); ++p) {
      const ChatPart& part = msg.parts[p];
      if (part.kind == ChatPart::Kind::kText) {
        w.Text(part.text);
        continue;
      }
      if (!config.has_vision()) {
        return absl::InvalidArgumentError(absl::StrCat("messages[", m, "].parts[", p, "]: this model (",
                                                       core::FamilyModelType(config.family),
                                                       ") is text-only and accepts no images"));
      }
      absl::StatusOr<int64_t> n = ImageTokenCount(part.grid_thw, merge);
      if (!n.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages[", m, "].parts[", p, "]: ", n.status().message()));
      }
      IRIS_RETURN_IF_ERROR(w.Id(vision_start));
      ChatPrompt::ImageSlot slot;
      slot.pad_begin = w.size();
      for (int64_t i = 0; i < *n; ++i) IRIS_RETURN_IF_ERROR(w.Id(image_pad));
      slot.pad_end = w.size();
      slot.grid_thw = part.grid_thw;
      prompt.images.push_back(slot);
      IRIS_RETURN_IF_ERROR(w.Id(vision_end));
    }
    IRIS_RETURN_IF_ERROR(footer());
  }
  if (add_generation_prompt) {
    IRIS_RETURN_IF_ERROR(header("assistant"));
  }
  IRIS_RETURN_IF_ERROR(w.Flush());
  prompt.ids = w.Take();
  return prompt;
}

}  // namespace iris::llm
