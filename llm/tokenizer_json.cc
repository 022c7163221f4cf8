#include "llm/tokenizer_json.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace iris::llm {
namespace {

using json = nlohmann::json;

class Handler : public nlohmann::json_sax<json> {
 public:
  explicit Handler(TokenizerJson* out) : out_(out) {}

  const std::string& error() const { return error_; }

  bool null() override { return Value(json(nullptr)); }
  bool boolean(bool v) override { return Value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return VocabId(v);
    return Value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      return VocabId(v > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<int64_t>(v));
    }
    return Value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return Value(json(v)); }
  bool binary(binary_t&) override { return Fail("unexpected binary value"); }

  bool string(string_t& v) override {
    switch (mode_) {
      case Mode::kMerges: {
        // "left right": exactly one space.
        const size_t space = v.find(' ');
        if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
          return Fail(absl::StrCat("model.merges[", out_->bpe.merges.size(), "] = \"", v,
                                   "\" is not two tokens separated by one space"));
        }
        out_->bpe.AddMerge(std::string_view(v).substr(0, space), std::string_view(v).substr(space + 1));
        return true;
      }
      case Mode::kMergePair:
        if (pair_parts_.size() == 2) return Fail(BadPair());
        pair_parts_.push_back(std::move(v));
        return true;
      case Mode::kVocab:
        return Fail(absl::StrCat("model.vocab[\"", key_, "\"] is not an integer id"));
      case Mode::kDom:
        return Value(json(std::move(v)));
    }
    return false;
  }

  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) return Fail(Unexpected("an object"));
    if (stack_.size() == 2 && stack_[1] == model_ && key_ == "vocab") {
      if (out_->has_vocab) return Fail("model.vocab appears twice");
      out_->has_vocab = true;
      mode_ = Mode::kVocab;
      return true;
    }
    json* obj = Insert(json::object());
    if (obj == nullptr) return false;
    if (stack_.size() == 1 && key_ == "model") model_ = obj;
    stack_.push_back(obj);
    return true;
  }

  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_parts_.clear();
      return true;
    }
    if (mode_ != Mode::kDom) return Fail(Unexpected("an array"));
    if (stack_.size() == 2 && stack_[1] == model_ && key_ == "merges") {
      if (out_->has_merges) return Fail("model.merges appears twice");
      out_->has_merges = true;
      mode_ = Mode::kMerges;
      return true;
    }
    json* arr = Insert(json::array());
    if (arr == nullptr) return false;
    stack_.push_back(arr);
    return true;
  }

  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_parts_.size() != 2) return Fail(BadPair());
      out_->bpe.AddMerge(pair_parts_[0], pair_parts_[1]);
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kDom;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    return Fail(ex.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges, kMergePair };

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  std::string Unexpected(const char* what) const {
    switch (mode_) {
      case Mode::kVocab: return absl::StrCat("model.vocab[\"", key_, "\"] is ", what, ", not an integer id");
      case Mode::kMerges: return absl::StrCat("model.merges[", out_->bpe.merges.size(), "] is ", what);
      default: return BadPair();
    }
  }
  std::string BadPair() const {
    return absl::StrCat("model.merges[", out_->bpe.merges.size(), "] is not a pair of two token strings");
  }

  bool VocabId(int64_t id) {
    if (id < 0) return Fail(absl::StrCat("model.vocab[\"", key_, "\"] has a negative or huge id"));
    out_->bpe.AddToken(key_, id);
    return true;
  }

  // Adds a value to the current container (or makes it the root); returns where it went.
  json* Insert(json v) {
    if (stack_.empty()) {
      if (!out_->doc.is_null()) {
        Fail("more than one top-level value");
        return nullptr;
      }
      out_->doc = std::move(v);
      return &out_->doc;
    }
    json* top = stack_.back();
    if (top->is_object()) {
      json& slot = (*top)[key_];
      slot = std::move(v);
      return &slot;
    }
    top->push_back(std::move(v));
    return &top->back();
  }

  bool Value(json v) {
    if (mode_ == Mode::kVocab) {
      return Fail(absl::StrCat("model.vocab[\"", key_, "\"] is not an integer id"));
    }
    if (mode_ != Mode::kDom) return Fail(mode_ == Mode::kMerges ? Unexpected("not a string") : BadPair());
    return Insert(std::move(v)) != nullptr;
  }

  TokenizerJson* out_;
  std::vector<json*> stack_;
  json* model_ = nullptr;
  std::string key_;
  Mode mode_ = Mode::kDom;
  std::vector<std::string> pair_parts_;
  std::string error_;
};

}  // namespace

absl::StatusOr<TokenizerJson> ParseTokenizerJson(std::string_view text, std::string_view source) {
  TokenizerJson out;
  Handler handler(&out);
  const bool ok = json::sax_parse(text.begin(), text.end(), &handler);
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": ", handler.error()));
  }
  if (!out.doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": the top level is not a JSON object"));
  }
  return out;
}

}  // namespace iris::llm
