#include "core/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/bf16.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace iris::core {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("iris_st_" + std::to_string(::getpid()) + "_" + name)).string();
}

void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  Tensor a = Tensor::Empty(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) a.data<float>()[i] = 0.5f * i;
  Tensor b = Tensor::Empty(DType::kBF16, {5});
  for (int i = 0; i < 5; ++i) b.data<uint16_t>()[i] = FloatToBf16(-1.0f * i);
  Tensor c = Tensor::Empty(DType::kI64, {1, 3});
  for (int i = 0; i < 3; ++i) c.data<int64_t>()[i] = 100 + i;
  const std::string path = TempPath("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", a}, {"b", b}, {"c", c}}, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  ASSERT_EQ((*f)->entries().size(), 3u);
  auto ta = (*f)->Get("a");
  ASSERT_TRUE(ta.ok());
  EXPECT_EQ(ta->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->data<float>()[5], 2.5f);
  auto tb = (*f)->Get("b");
  EXPECT_EQ(Bf16ToFloat(tb->data<uint16_t>()[4]), -4.0f);
  EXPECT_EQ((*f)->Get("c")->data<int64_t>()[2], 102);
  EXPECT_EQ((*f)->Get("missing").status().code(), absl::StatusCode::kNotFound);
  // The view outlives the file object.
  Tensor keep = *ta;
  f->reset();
  EXPECT_EQ(keep.data<float>()[1], 0.5f);
  std::filesystem::remove(path);
}

// The header parser works on bytes in memory (the fuzz target feeds it directly): it agrees with
// Open on a real file and refuses every truncation of it without reading past the end.
TEST(Safetensors, ParsesAHeaderFromMemoryAsOpenDoes) {
  Tensor a = Tensor::Empty(DType::kF32, {3});
  Tensor b = Tensor::Empty(DType::kBF16, {2, 2});
  const std::string path = TempPath("mem.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", a}, {"b", b}}, {{"format", "pt"}}).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  auto header = ParseSafetensorsHeader({data, bytes.size()}, "mem");
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->entries.size(), (*file)->entries().size());
  for (size_t i = 0; i < header->entries.size(); ++i) {
    EXPECT_EQ(header->entries[i].name, (*file)->entries()[i].name);
    EXPECT_EQ(header->entries[i].begin, (*file)->entries()[i].begin);
    EXPECT_EQ(header->entries[i].end, (*file)->entries()[i].end);
  }
  EXPECT_EQ(header->metadata, (*file)->metadata());
  EXPECT_EQ(header->data_start + 12 + 8, bytes.size());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    // An exact-size copy, so that ASan sees any read past the cut.
    std::vector<uint8_t> prefix(data, data + cut);
    EXPECT_FALSE(ParseSafetensorsHeader(prefix, "mem").ok()) << "accepted " << cut << " of " << bytes.size();
  }
  std::filesystem::remove(path);
}

struct BadCase {
  const char* name;
  std::string header;
  size_t data_bytes;
  const char* expect;
};

TEST(Safetensors, RejectsMalformedHeaders) {
  const std::vector<BadCase> cases = {
      {"not_json", "{not json", 0, "not a JSON object"},
      {"bad_dtype", R"({"x":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1, "unsupported dtype"},
      {"negative_shape", R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "non-negative"},
      {"past_end", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8, "outside the data section"},
      {"size_mismatch", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "bytes for 3"},
      {"overlap", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, "overlap"},
      {"missing_field", R"({"x":{"dtype":"F32","shape":[2]}})", 8, "data_offsets"},
  };
  for (const auto& c : cases) {
    const std::string path = TempPath(c.name);
    WriteRaw(path, c.header, c.data_bytes);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(f.status().message().find(c.expect), std::string::npos) << c.name << ": " << f.status();
    std::filesystem::remove(path);
  }
}

TEST(Safetensors, RejectsHeaderLengthBeyondFile) {
  const std::string path = TempPath("huge_len");
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << "{}";
  }
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("header length"), std::string::npos) << f.status();
  std::filesystem::remove(path);
  WriteRaw(path, "", 0);
  std::filesystem::resize_file(path, 3);
  EXPECT_FALSE(SafetensorsFile::Open(path).ok());
  std::filesystem::remove(path);
  EXPECT_EQ(SafetensorsFile::Open(path).status().code(), absl::StatusCode::kNotFound);
}

TEST(Checkpoint, OpensShardsThroughTheIndex) {
  namespace fs = std::filesystem;
  const fs::path dir = TempPath("sharded");
  fs::create_directories(dir);
  Tensor a = Tensor::Zeros(DType::kF32, {4});
  Tensor b = Tensor::Zeros(DType::kF32, {2});
  b.data<float>()[1] = 7.f;
  ASSERT_TRUE(WriteSafetensors((dir / "model-00001-of-00002.safetensors").string(), {{"w.a", a}}).ok());
  ASSERT_TRUE(WriteSafetensors((dir / "model-00002-of-00002.safetensors").string(), {{"w.b", b}}).ok());
  {
    std::ofstream idx(dir / "model.safetensors.index.json");
    idx << R"({"metadata":{},"weight_map":{"w.a":"model-00001-of-00002.safetensors","w.b":"model-00002-of-00002.safetensors"}})";
  }
  auto ckpt = Checkpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->Has("w.a"));
  EXPECT_EQ(ckpt->Get("w.b")->data<float>()[1], 7.f);
  EXPECT_EQ(ckpt->Names().size(), 2u);
  {
    std::ofstream idx(dir / "model.safetensors.index.json");
    idx << R"({"weight_map":{"w.a":"model-00001-of-00002.safetensors","w.c":"model-00002-of-00002.safetensors"}})";
  }
  auto bad = Checkpoint::Open(dir.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("w.c"), std::string::npos);
  fs::remove_all(dir);
  EXPECT_EQ(Checkpoint::Open(dir.string()).status().code(), absl::StatusCode::kNotFound);
}

TEST(Safetensors, ReadsTheGoldenFixtures) {
  auto f = SafetensorsFile::Open(testing::DataPath("vision/tiny-single_448x448.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  auto g = (*f)->Get("image_grid_thw");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->dtype(), DType::kI64);
  EXPECT_EQ(g->data<int64_t>()[1], 32);
}

}  // namespace
}  // namespace iris::core
