#include "llm/chat_template.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/model_config.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace iris::llm {
namespace {

constexpr std::string_view kSystemHeader = "<|im_start|>system";
constexpr std::string_view kEnd = "<|im_end|>";

// The template's text at `pos` as a newline: a real one, or the two characters `\n` inside a Jinja
// string literal. Returns its length (0: none).
size_t NewlineAt(std::string_view s, size_t pos) {
  if (pos < s.size() && s[pos] == '\n') return 1;
  if (pos + 1 < s.size() && s[pos] == '\\' && s[pos + 1] == 'n') return 2;
  return 0;
}

}  // namespace

absl::StatusOr<ChatStyle> ChatStyleFromTemplate(std::string_view jinja) {
  if (jinja.find("<|im_start|>") == std::string_view::npos) {
    return absl::InvalidArgumentError(
        "chat_template is not a ChatML (<|im_start|>) template; iris renders ChatML prompts only");
  }
  ChatStyle style;
  style.default_system_prompt.reset();
  for (size_t at = jinja.find(kSystemHeader); at != std::string_view::npos;
       at = jinja.find(kSystemHeader, at + 1)) {
    const size_t body = at + kSystemHeader.size();
    const size_t nl = NewlineAt(jinja, body);
    if (nl == 0) continue;
    const size_t end = jinja.find(kEnd, body + nl);
    if (end == std::string_view::npos) break;
    const std::string_view content = jinja.substr(body + nl, end - body - nl);
    // A literal, not `' + messages[0]['content'] + '` or a `{{ ... }}` block.
    if (content.empty() || content.find_first_of("{}'\"+\\\n") != std::string_view::npos) continue;
    style.default_system_prompt = std::string(content);
    break;
  }
  return style;
}

absl::StatusOr<ChatStyle> LoadChatStyle(const std::string& dir) {
  for (const char* name : {"chat_template.json", "tokenizer_config.json"}) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    if (!std::filesystem::exists(path)) continue;
    IRIS_ASSIGN_OR_RETURN(nlohmann::json j, core::ReadJsonFile(path));
    if (!j.is_object() || !j.contains("chat_template")) continue;
    const nlohmann::json& t = j["chat_template"];
    std::string text;
    if (t.is_string()) {
      text = t.get<std::string>();
    } else if (t.is_array()) {
      for (const auto& entry : t) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string()) {
          text = entry["template"].get<std::string>();
        }
      }
    }
    if (text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": chat_template must be a string (or a list with a ",
                                                     "\"default\" entry)"));
    }
    absl::StatusOr<ChatStyle> style = ChatStyleFromTemplate(text);
    if (!style.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", style.status().message()));
    return style;
  }
  return ChatStyle{};
}

}  // namespace iris::llm
