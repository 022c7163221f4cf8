// Prompt building (engine/prompt_builder.h) against the full-model goldens (tests/data/model): ids,
// M-RoPE positions, image pad ranges and pixel values identical to the reference; limits and bad
// input refused with the field named; the --messages JSON form.
#include "engine/prompt_builder.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/model_config.h"
#include "core/sha256.h"
#include "engine/model.h"
#include "kernels/device.h"
#include "kernels/patch_rows.h"
#include "vision/pixel_table.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "llm/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::engine {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// BuildPrompt uses only the configs and the tokenizer: a Model with no encoder or decoder, from the
// reference checkpoint's JSON files (tests/data/tiny-qwen2.5-vl).
const Model& TinyModel() {
  static const Model* model = [] {
    const std::string dir = testing::DataPath("tiny-qwen2.5-vl");
    auto config = core::LoadModelConfig(dir);
    auto pp = core::LoadPreprocessorConfig(dir);
    auto tok = llm::Tokenizer::Load(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(pp.ok()) << pp.status();
    EXPECT_TRUE(tok.ok()) << tok.status();
    return new Model{dir, *config, *pp, {151645, 151643}, {}, std::move(*tok), nullptr, nullptr, {}, nullptr, {}, nullptr};
  }();
  return *model;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json& Cases() {
  static const json cases = testing::LoadDataJson("model/manifest_tiny.json")["cases"];
  return cases;
}

const json& Case(const std::string& name) {
  for (const json& c : Cases()) {
    if (c["case"] == "model-tiny-" + name) return c;
  }
  ADD_FAILURE() << "no case " << name;
  static const json none;
  return none;
}

ChatInputPart TextPart(std::string text) {
  ChatInputPart p;
  p.text = std::move(text);
  return p;
}

ChatInputPart ImagePart(const std::string& data_relative) {
  ChatInputPart p;
  p.kind = ChatInputPart::Kind::kImage;
  p.image_bytes = ReadBytes(testing::DataPath(data_relative));
  return p;
}

// The case's messages, image parts taking the case's image files in order.
std::vector<ChatInputMessage> Messages(const json& c) {
  std::vector<ChatInputMessage> out;
  size_t next_image = 0;
  for (const json& m : c["messages"]) {
    ChatInputMessage msg;
    msg.role = m["role"].get<std::string>();
    if (m["content"].is_string()) {
      msg.parts.push_back(TextPart(m["content"].get<std::string>()));
    } else {
      for (const json& part : m["content"]) {
        if (part["type"] == "image") {
          msg.parts.push_back(ImagePart(c["images"].at(next_image++).get<std::string>()));
        } else {
          msg.parts.push_back(TextPart(part["text"].get<std::string>()));
        }
      }
    }
    out.push_back(std::move(msg));
  }
  EXPECT_EQ(next_image, c["images"].size());
  return out;
}

// The pixel_values rows an encoder makes of a prompt image's bytes (kernels::PatchRows, here on the CPU).
std::vector<float> EncoderPixelValues(const core::Tensor& rgb, const core::PreprocessorConfig& pp) {
  auto device = kernels::CreateDevice(kernels::DeviceOptions{});
  EXPECT_TRUE(device.ok()) << device.status();
  if (!device.ok()) return {};
  const kernels::PatchGrid grid{pp.patch_size, pp.temporal_patch_size, pp.merge_size, rgb.dim(0), rgb.dim(1)};
  const std::array<float, vision::kPixelTableSize> table = vision::PixelTable(pp.image_mean, pp.image_std);
  std::vector<float> values(static_cast<size_t>(grid.rows() * grid.row_length()));
  kernels::PatchRows(**device, rgb.data<uint8_t>(), grid, table.data(), 0, grid.rows(), values.data());
  return values;
}

TEST(PromptBuilderTest, GoldenIdsPositionsAndImageSlots) {
  ASSERT_EQ(Cases().size(), 3u);
  const Model& model = TinyModel();
  for (const json& c : Cases()) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const std::string file = c["arrays"]["file"].get<std::string>();
    auto prompt = BuildPrompt(model, Messages(c));
    ASSERT_TRUE(prompt.ok()) << prompt.status();

    const std::vector<int64_t> ids = testing::Int64Values(testing::LoadGolden(file, "input_ids"));
    ASSERT_EQ(prompt->ids.size(), ids.size());
    ASSERT_EQ(static_cast<int64_t>(ids.size()), c["prompt_len"].get<int64_t>());
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(prompt->ids[i], ids[i]) << "input_ids[" << i << "]";

    const std::vector<int64_t> pos = testing::Int64Values(testing::LoadGolden(file, "position_ids"));
    ASSERT_EQ(pos.size(), 3 * ids.size());
    for (int a = 0; a < 3; ++a) {
      ASSERT_EQ(prompt->positions.positions[a].size(), ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(prompt->positions.positions[a][i], pos[a * ids.size() + i]) << "axis " << a << " index " << i;
      }
    }
    const std::vector<int64_t> delta = testing::Int64Values(testing::LoadGolden(file, "rope_deltas"));
    EXPECT_EQ(prompt->positions.rope_delta, delta.at(0));

    // Image slots: the right ranges, the reference's grids and pixel values.
    EXPECT_EQ(prompt->num_image_tokens(), c["num_image_tokens"].get<int64_t>());
    ASSERT_EQ(prompt->images.size(), c["images"].size());
    if (prompt->images.empty()) continue;
    const std::vector<int64_t> grids = testing::Int64Values(testing::LoadGolden(file, "image_grid_thw"));
    std::string all_pixels;
    int64_t covered = 0;
    for (size_t k = 0; k < prompt->images.size(); ++k) {
      const PromptImage& im = prompt->images[k];
      for (int j = 0; j < 3; ++j) EXPECT_EQ(im.grid_thw[j], grids[k * 3 + j]);
      EXPECT_EQ(im.pad_end - im.pad_begin, im.grid_thw[0] * im.grid_thw[1] * im.grid_thw[2] / 4);
      ASSERT_GT(im.pad_begin, 0);
      ASSERT_LT(im.pad_end, static_cast<int64_t>(ids.size()));
      EXPECT_EQ(ids[im.pad_begin - 1], model.config.vision_start_token_id);
      EXPECT_EQ(ids[im.pad_end], model.config.vision_end_token_id);
      for (int64_t i = im.pad_begin; i < im.pad_end; ++i) ASSERT_EQ(ids[i], model.config.image_token_id);
      covered += im.pad_end - im.pad_begin;
      ASSERT_NE(im.rgb, nullptr);
      EXPECT_EQ(im.rgb->dtype(), core::DType::kU8);
      EXPECT_EQ(im.rgb->shape(), (std::vector<int64_t>{im.grid_thw[1] * 14, im.grid_thw[2] * 14, 3}));
      // The pixel values the encoder makes of the bytes: the reference's.
      const std::vector<float> values = EncoderPixelValues(*im.rgb, model.preprocessor);
      all_pixels.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
      EXPECT_EQ(im.content_hash.size(), 64u);
    }
    int64_t pads = 0;
    for (int64_t id : ids) pads += id == model.config.image_token_id;
    EXPECT_EQ(covered, pads);  // every <|image_pad|> belongs to exactly one image
    EXPECT_EQ(core::Sha256Hex(all_pixels.data(), all_pixels.size()),
              c["pixel_values_float32_sha256"].get<std::string>());
  }
}

TEST(PromptBuilderTest, ContentHashIsTheImageNotTheRequest) {
  const Model& model = TinyModel();
  std::vector<ChatInputMessage> msgs(1);
  msgs[0].role = "user";
  msgs[0].parts = {ImagePart("images/rgb_300x200.png"), ImagePart("images/rgb_300x200.png"),
                   ImagePart("images/gray_56x56.png"), ImagePart("images/rgb_300x200.png"), TextPart("hi")};
  msgs[0].parts[3].max_pixels = 200 * 200;  // the same file, resized smaller
  auto prompt = BuildPrompt(model, msgs);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  ASSERT_EQ(prompt->images.size(), 4u);
  EXPECT_EQ(prompt->images[0].content_hash, prompt->images[1].content_hash);
  EXPECT_NE(prompt->images[0].content_hash, prompt->images[2].content_hash);
  EXPECT_NE(prompt->images[0].content_hash, prompt->images[3].content_hash);
  EXPECT_LT(prompt->images[3].pad_end - prompt->images[3].pad_begin,
            prompt->images[0].pad_end - prompt->images[0].pad_begin);
  // Slots in order and disjoint.
  for (size_t k = 1; k < prompt->images.size(); ++k) {
    EXPECT_GT(prompt->images[k].pad_begin, prompt->images[k - 1].pad_end);
  }
  // A tighter request bound is honoured: 2048x1536 within max_pixels 1003520 -> 1148x840 (60x82 patches).
  std::vector<ChatInputMessage> big(1);
  big[0].role = "user";
  big[0].parts = {ImagePart("images/jpeg420_q90_2048x1536.jpg")};
  big[0].parts[0].max_pixels = 1003520;
  auto bounded = BuildPrompt(model, big);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_EQ(bounded->images[0].grid_thw, (std::array<int64_t, 3>{1, 60, 82}));
}

TEST(PromptBuilderTest, RefusesBadInputNamingTheField) {
  const Model& model = TinyModel();
  auto expect_error = [&](const std::vector<ChatInputMessage>& msgs, const PromptLimits& limits,
                          const std::string& text) {
    auto p = BuildPrompt(model, msgs, limits);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(text));
  };
  const PromptLimits defaults;

  std::vector<ChatInputMessage> bad(2);
  bad[0].role = "system";
  bad[0].parts = {TextPart("Be brief.")};
  bad[1].role = "user";
  bad[1].parts = {TextPart("look:"), ImagePart("images/rgb_300x200.png"), TextPart("and"), ImagePart("images/gray_56x56.png")};
  bad[1].parts[3].image_bytes = "this is not an image at all";
  expect_error(bad, defaults, "messages[1].content[3].image: ");
  expect_error(bad, defaults, "unsupported image format");
  bad[1].parts[3].image_bytes.clear();
  expect_error(bad, defaults, "messages[1].content[3].image: ");
  // A truncated PNG: the header is fine, the data is not.
  bad[1].parts[3] = ImagePart("images/rgb_300x200.png");
  bad[1].parts[3].image_bytes.resize(bad[1].parts[3].image_bytes.size() / 2);
  expect_error(bad, defaults, "messages[1].content[3].image: ");
  // Decode limits apply.
  PromptLimits small_decode;
  small_decode.decode.max_side = 100;
  bad[1].parts[3] = ImagePart("images/gray_56x56.png");
  expect_error(bad, small_decode, "messages[1].content[1].image: ");
  // Too small for the processor.
  bad[1].parts[3] = ImagePart("images/rgb_20x300.png");
  expect_error(bad, defaults, "messages[1].content[3].image: ");

  // Too many images: refused before anything is decoded.
  std::vector<ChatInputMessage> many(1);
  many[0].role = "user";
  for (int i = 0; i < 17; ++i) {
    ChatInputPart p;
    p.kind = ChatInputPart::Kind::kImage;
    p.image_bytes = "x";
    many[0].parts.push_back(p);
  }
  {
    auto p = BuildPrompt(model, many);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().message(), "messages: 17 images, the limit is 16");
  }
  PromptLimits two;
  two.max_images = 2;
  std::vector<ChatInputMessage> three(1);
  three[0].role = "user";
  three[0].parts = {ImagePart("images/gray_56x56.png"), ImagePart("images/gray_56x56.png"),
                    ImagePart("images/gray_56x56.png")};
  expect_error(three, two, "messages: 3 images, the limit is 2");
  three[0].parts.pop_back();
  EXPECT_TRUE(BuildPrompt(model, three, two).ok());

  // Too long: one_image is 105 tokens (77 of them image tokens).
  PromptLimits short_prompt;
  short_prompt.max_prompt_tokens = 100;
  const auto one_image = Messages(Case("one_image"));
  expect_error(one_image, short_prompt, "max_prompt_tokens 100");
  expect_error(one_image, short_prompt, "105 tokens");
  short_prompt.max_prompt_tokens = 105;
  EXPECT_TRUE(BuildPrompt(model, one_image, short_prompt).ok());

  // Pixel bounds may only tighten the model's [3136, 12845056].
  auto loose = one_image;
  loose[0].parts[0].max_pixels = 99999999999;
  expect_error(loose, defaults, "messages[0].content[0]: max_pixels 99999999999 is outside the allowed range [3136, 12845056]");
  loose[0].parts[0].max_pixels.reset();
  loose[0].parts[0].min_pixels = 1000;
  expect_error(loose, defaults, "messages[0].content[0]: min_pixels 1000 is outside the allowed range");
  loose[0].parts[0].min_pixels = 500000;
  loose[0].parts[0].max_pixels = 100000;
  expect_error(loose, defaults, "messages[0].content[0]: min_pixels 500000 exceeds max_pixels 100000");

  // Roles, empty chats, and text that would forge image slots.
  auto no_role = one_image;
  no_role[0].role.clear();
  expect_error(no_role, defaults, "messages[0].role: empty");
  expect_error({}, defaults, "messages: empty");
  auto forged = one_image;
  forged[0].parts[1].text = "what is <|image_pad|> here?";
  expect_error(forged, defaults, "messages[0].content[1].text: ");
  expect_error(forged, defaults, "<|image_pad|>");
}

// The same prompt from a Model that LoadModel built (configs, tokenizer and EOS ids from the files).
TEST(PromptBuilderTest, WorksWithALoadedModel) {
  ModelOptions options;
  options.compute = kernels::ComputeType::kF32;
  auto model = LoadModel(testing::ModelPath("tiny"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  const json& c = Case("two_images");
  auto prompt = BuildPrompt(**model, Messages(c));
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::vector<int64_t> ids =
      testing::Int64Values(testing::LoadGolden(c["arrays"]["file"].get<std::string>(), "input_ids"));
  ASSERT_EQ(prompt->ids.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(prompt->ids[i], ids[i]);
  EXPECT_EQ(prompt->num_image_tokens(), 395);
}

class ParseMessagesJsonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("iris_prompt_builder_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::filesystem::copy_file(testing::DataPath("images/gray_56x56.png"), dir_ / "gray.png",
                               std::filesystem::copy_options::overwrite_existing);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(ParseMessagesJsonTest, ReadsTextAndImages) {
  const std::string text = R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [
      {"type": "image", "image": "gray.png"},
      {"type": "image", "image": ")" + testing::DataPath("images/rgb_300x200.png") + R"(", "max_pixels": 50000},
      {"type": "text", "text": "Compare."}]}
  ])";
  auto msgs = ParseMessagesJson(text, dir_.string());
  ASSERT_TRUE(msgs.ok()) << msgs.status();
  ASSERT_EQ(msgs->size(), 2u);
  EXPECT_EQ((*msgs)[0].role, "system");
  ASSERT_EQ((*msgs)[0].parts.size(), 1u);
  EXPECT_EQ((*msgs)[0].parts[0].kind, ChatInputPart::Kind::kText);
  EXPECT_EQ((*msgs)[0].parts[0].text, "Be brief.");
  const auto& parts = (*msgs)[1].parts;
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].kind, ChatInputPart::Kind::kImage);
  EXPECT_EQ(parts[0].image_bytes, ReadBytes(testing::DataPath("images/gray_56x56.png")));
  EXPECT_FALSE(parts[0].max_pixels.has_value());
  EXPECT_EQ(parts[1].image_bytes, ReadBytes(testing::DataPath("images/rgb_300x200.png")));
  EXPECT_EQ(parts[1].max_pixels, 50000);
  EXPECT_EQ(parts[2].text, "Compare.");
  auto prompt = BuildPrompt(TinyModel(), *msgs);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->images.size(), 2u);

  // The object form of a chat request body works too.
  auto wrapped = ParseMessagesJson(R"({"messages": [{"role": "user", "content": "hi"}]})", "");
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  EXPECT_EQ((*wrapped)[0].parts[0].text, "hi");
}

TEST_F(ParseMessagesJsonTest, NamesThePathOfWhatIsWrong) {
  struct Case {
    std::string json, message;
  };
  const std::vector<Case> cases = {
      {"[{\"role\": \"user\", \"content\": \"hi\"", "messages: invalid JSON"},
      {"", "messages: invalid JSON"},
      {"{\"role\": \"user\"}", "messages: expected a list of messages, got object"},
      {"[]", "messages: empty"},
      {"[3]", "messages[0]: expected an object, got number"},
      {"[{\"content\": \"hi\"}]", "messages[0].role: missing"},
      {"[{\"role\": 1, \"content\": \"hi\"}]", "messages[0].role: expected a string, got number"},
      {"[{\"role\": \"\", \"content\": \"hi\"}]", "messages[0].role: empty"},
      {"[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"user\"}]", "messages[1].content: missing"},
      {"[{\"role\": \"user\", \"content\": 7}]", "messages[0].content: expected a string or a list of parts"},
      {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"video\"}]}]",
       "messages[0].content[1].type: unknown part type \"video\""},
      {"[{\"role\": \"user\", \"content\": [{\"text\": \"a\"}]}]", "messages[0].content[0].type"},
      {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 5}]}]", "messages[0].content[0].text"},
      {"[{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]", "messages[0].content[0].image: expected a file path"},
      {"[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": \"missing.png\"}]}]",
       "messages[0].content[0].image: cannot read " + (dir_ / "missing.png").string()},
      {"[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": \"gray.png\", \"min_pixels\": \"x\"}]}]",
       "messages[0].content[0].min_pixels: expected an integer, got string"},
  };
  for (const auto& c : cases) {
    auto r = ParseMessagesJson(c.json, dir_.string());
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message)) << c.json;
  }
}

}  // namespace
}  // namespace iris::engine
