#include "engine/prompt_builder.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status_macros.h"
#include "llm/chat_format.h"
#include "llm/mrope.h"
#include "nlohmann/json.hpp"
#include "core/parallel_for.h"
#include "vision/pixel_bounds.h"
#include "vision/preprocess.h"

namespace iris::engine {
namespace {

using json = nlohmann::json;

absl::Status Prefixed(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, ": ", status.message()));
}

std::string PartPath(size_t message, size_t part) {
  return absl::StrCat("messages[", message, "].content[", part, "]");
}

// One image part on its way to a PromptImage.
struct ImageJob {
  size_t message = 0;
  size_t part = 0;
  const ChatInputPart* input = nullptr;
  absl::Status status;
  PromptImage image;
};

// The encoder cache key: SHA-256 over the resized image's bytes and the grid. The grid is part of
// the key because the same bytes could in principle be read as another (h, w) of equal area; the
// digest is hashed again with the grid rather than copying the buffer. (The model's normalization
// is fixed for the server's life, so the bytes and the grid decide the pixel values.)
std::string ContentHash(const core::Tensor& rgb, const std::array<int64_t, 3>& grid) {
  const std::string pixels = core::Sha256Hex(rgb.raw(), rgb.nbytes());
  const std::string keyed = absl::StrCat("iris-image rgb8 ", rgb.ShapeString(), " grid ", grid[0], "x", grid[1], "x",
                                         grid[2], " ", pixels);
  return core::Sha256Hex(keyed.data(), keyed.size());
}

// Decode, bound, preprocess and hash one image part.
void RunImageJob(const Model& model, const PromptLimits& limits, ImageJob& job) {
  const std::string path = PartPath(job.message, job.part);
  absl::StatusOr<vision::ResolvedPixelBounds> bounds =
      vision::ResolvePixelBounds(model.preprocessor, job.input->min_pixels, job.input->max_pixels);
  if (!bounds.ok()) {
    job.status = Prefixed(bounds.status(), path);
    return;
  }
  const std::string& bytes = job.input->image_bytes;
  if (bytes.empty()) {
    job.status = absl::InvalidArgumentError(absl::StrCat(path, ".image: empty image"));
    return;
  }
  absl::StatusOr<vision::RgbImage> rgb = vision::DecodeImage(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), limits.decode);
  if (!rgb.ok()) {
    job.status = Prefixed(rgb.status(), path + ".image");
    return;
  }
  absl::StatusOr<vision::PreprocessedImage> pre = vision::Preprocess(
      *rgb, model.preprocessor, vision::PixelBounds{bounds->min_pixels, bounds->max_pixels});
  if (!pre.ok()) {
    job.status = Prefixed(pre.status(), path + ".image");
    return;
  }
  job.image.grid_thw = pre->grid_thw;
  job.image.content_hash = ContentHash(pre->rgb, pre->grid_thw);
  job.image.rgb = std::make_shared<const core::Tensor>(std::move(pre->rgb));
}

// llm::BuildPrompt names no field when text holds a reserved token: find the part that does.
absl::Status LocateChatError(const Model& model, const std::vector<ChatInputMessage>& messages,
                             const absl::Status& status) {
  const int64_t reserved[] = {model.config.image_token_id, model.config.video_token_id,
                              model.config.vision_start_token_id, model.config.vision_end_token_id};
  auto has_reserved = [&](const std::string& text) {
    absl::StatusOr<std::vector<int32_t>> ids = model.tokenizer.Encode(text);
    if (!ids.ok()) return false;
    for (int32_t id : *ids) {
      for (int64_t r : reserved) {
        if (id == r) return true;
      }
    }
    return false;
  };
  for (size_t m = 0; m < messages.size(); ++m) {
    if (has_reserved(messages[m].role)) return Prefixed(status, absl::StrCat("messages[", m, "].role"));
    for (size_t p = 0; p < messages[m].parts.size(); ++p) {
      const ChatInputPart& part = messages[m].parts[p];
      if (part.kind == ChatInputPart::Kind::kText && has_reserved(part.text)) {
        return Prefixed(status, PartPath(m, p) + ".text");
      }
    }
  }
  return Prefixed(status, "messages");
}

}  // namespace

absl::StatusOr<Prompt> BuildPrompt(const Model& model, const std::vector<ChatInputMessage>& messages,
                                   const PromptLimits& limits) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: empty, at least one message is required");
  std::vector<ImageJob> jobs;
  for (size_t m = 0; m < messages.size(); ++m) {
    if (messages[m].role.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", m, "].role: empty"));
    }
    for (size_t p = 0; p < messages[m].parts.size(); ++p) {
      const ChatInputPart& part = messages[m].parts[p];
      if (part.kind != ChatInputPart::Kind::kImage) continue;
      if (!model.config.has_vision()) {
        return absl::InvalidArgumentError(absl::StrCat(PartPath(m, p), ".image: this model (",
                                                       core::FamilyModelType(model.config.family),
                                                       ") is text-only and accepts no images"));
      }
      ImageJob job;
      job.message = m;
      job.part = p;
      job.input = &part;
      jobs.push_back(std::move(job));
    }
  }
  if (static_cast<int64_t>(jobs.size()) > limits.max_images) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: ", jobs.size(), " images, the limit is ", limits.max_images));
  }

  // Images in parallel (each decode is single-threaded; Preprocess runs alone inside a worker).
  // One image keeps Preprocess's own parallel loop.
  if (jobs.size() == 1) {
    RunImageJob(model, limits, jobs[0]);
  } else if (jobs.size() > 1) {
    core::ParallelFor(static_cast<int>(jobs.size()),
                                  [&](int i, int) { RunImageJob(model, limits, jobs[i]); });
  }
  for (const ImageJob& job : jobs) {
    if (!job.status.ok()) return job.status;  // the first failing image, in prompt order
  }

  std::vector<llm::ChatMessage> chat;
  chat.reserve(messages.size());
  size_t next_image = 0;
  for (const ChatInputMessage& in : messages) {
    llm::ChatMessage msg;
    msg.role = in.role;
    for (const ChatInputPart& part : in.parts) {
      if (part.kind == ChatInputPart::Kind::kImage) {
        msg.parts.push_back(llm::ChatPart::Image(jobs[next_image++].image.grid_thw));
      } else {
        msg.parts.push_back(llm::ChatPart::Text(part.text));
      }
    }
    chat.push_back(std::move(msg));
  }
  absl::StatusOr<llm::ChatPrompt> rendered = llm::BuildPrompt(model.tokenizer, model.config, chat, model.chat_style);
  if (!rendered.ok()) {
    if (rendered.status().code() == absl::StatusCode::kInvalidArgument) {
      return LocateChatError(model, messages, rendered.status());
    }
    return rendered.status();
  }
  if (rendered->images.size() != jobs.size()) {
    return absl::InternalError(absl::StrCat("chat prompt has ", rendered->images.size(), " image slots for ",
                                            jobs.size(), " images"));
  }
  const int64_t length = static_cast<int64_t>(rendered->ids.size());
  if (length > limits.max_prompt_tokens) {
    int64_t image_tokens = 0;
    for (const auto& slot : rendered->images) image_tokens += slot.pad_end - slot.pad_begin;
    return absl::InvalidArgumentError(absl::StrCat("messages: the prompt is ", length, " tokens (", image_tokens,
                                                   " of them image tokens), over max_prompt_tokens ",
                                                   limits.max_prompt_tokens));
  }

  Prompt prompt;
  prompt.images.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    PromptImage image = std::move(jobs[i].image);
    image.pad_begin = rendered->images[i].pad_begin;
    image.pad_end = rendered->images[i].pad_end;
    prompt.images.push_back(std::move(image));
  }
  if (model.config.has_vision()) {
    IRIS_ASSIGN_OR_RETURN(prompt.positions,
                          llm::ComputeMropePositions(rendered->ids, rendered->image_grids(), model.config));
  } else {
    prompt.positions = llm::TextPositions(length);
  }
  prompt.ids = std::move(rendered->ids);
  return prompt;
}

namespace {

absl::StatusOr<std::string> ReadImageFile(const std::string& path, int64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (static_cast<int64_t>(size) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", size, " bytes, over the limit of ", max_bytes, " bytes"));
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::string bytes(size, '\0');
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (got != bytes.size()) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": short read"));
  return bytes;
}

const char* TypeName(const json& j) { return j.type_name(); }

absl::StatusOr<std::optional<int64_t>> OptionalInt(const json& part, const char* key, const std::string& path) {
  auto it = part.find(key);
  if (it == part.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ".", key, ": expected an integer, got ", TypeName(*it)));
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

}  // namespace

absl::StatusOr<std::vector<ChatInputMessage>> ParseMessagesJson(const std::string& text,
                                                                const std::string& base_dir) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("messages: invalid JSON: ", e.what()));
  }
  // A bare list, or {"messages": [...]} as in a chat request body.
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  if (!j.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat("messages: expected a list of messages, got ", TypeName(j)));
  }
  const vision::DecodeLimits decode_limits;
  std::vector<ChatInputMessage> messages;
  for (size_t m = 0; m < j.size(); ++m) {
    const json& jm = j[m];
    const std::string mpath = absl::StrCat("messages[", m, "]");
    if (!jm.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(mpath, ": expected an object, got ", TypeName(jm)));
    }
    ChatInputMessage msg;
    auto role = jm.find("role");
    if (role == jm.end()) return absl::InvalidArgumentError(absl::StrCat(mpath, ".role: missing"));
    if (!role->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(mpath, ".role: expected a string, got ", TypeName(*role)));
    }
    msg.role = role->get<std::string>();
    if (msg.role.empty()) return absl::InvalidArgumentError(absl::StrCat(mpath, ".role: empty"));
    auto content = jm.find("content");
    if (content == jm.end()) return absl::InvalidArgumentError(absl::StrCat(mpath, ".content: missing"));
    if (content->is_string()) {
      msg.parts.push_back(ChatInputPart{ChatInputPart::Kind::kText, content->get<std::string>(), {}, {}, {}});
    } else if (content->is_array()) {
      for (size_t p = 0; p < content->size(); ++p) {
        const json& jp = (*content)[p];
        const std::string ppath = absl::StrCat(mpath, ".content[", p, "]");
        if (jp.is_string()) {  // a bare string part is text
          msg.parts.push_back(ChatInputPart{ChatInputPart::Kind::kText, jp.get<std::string>(), {}, {}, {}});
          continue;
        }
        if (!jp.is_object()) {
          return absl::InvalidArgumentError(absl::StrCat(ppath, ": expected an object, got ", TypeName(jp)));
        }
        auto type = jp.find("type");
        if (type == jp.end() || !type->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(ppath, ".type: expected \"text\" or \"image\""));
        }
        const std::string kind = type->get<std::string>();
        ChatInputPart part;
        if (kind == "text") {
          auto t = jp.find("text");
          if (t == jp.end() || !t->is_string()) {
            return absl::InvalidArgumentError(absl::StrCat(ppath, ".text: expected a string"));
          }
          part.kind = ChatInputPart::Kind::kText;
          part.text = t->get<std::string>();
        } else if (kind == "image") {
          auto im = jp.find("image");
          if (im == jp.end() || !im->is_string() || im->get_ref<const std::string&>().empty()) {
            return absl::InvalidArgumentError(absl::StrCat(ppath, ".image: expected a file path"));
          }
          std::filesystem::path file(im->get<std::string>());
          if (file.is_relative() && !base_dir.empty()) file = std::filesystem::path(base_dir) / file;
          absl::StatusOr<std::string> bytes = ReadImageFile(file.string(), decode_limits.max_bytes);
          if (!bytes.ok()) return Prefixed(bytes.status(), ppath + ".image");
          part.kind = ChatInputPart::Kind::kImage;
          part.image_bytes = std::move(*bytes);
          IRIS_ASSIGN_OR_RETURN(part.min_pixels, OptionalInt(jp, "min_pixels", ppath));
          IRIS_ASSIGN_OR_RETURN(part.max_pixels, OptionalInt(jp, "max_pixels", ppath));
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat(ppath, ".type: unknown part type \"", kind, "\" (expected \"text\" or \"image\")"));
        }
        msg.parts.push_back(std::move(part));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(mpath, ".content: expected a string or a list of parts, got ", TypeName(*content)));
    }
    messages.push_back(std::move(msg));
  }
  if (messages.empty()) return absl::InvalidArgumentError("messages: empty, at least one message is required");
  return messages;
}

}  // namespace iris::engine
