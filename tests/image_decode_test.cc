// Image decoding against the reference's load_image (Pillow 9.4: open -> exif_transpose ->
// convert("RGB")): the golden images of tests/data/images (digests and crops from
// tests/data/preprocess), the fixtures of tests/data/decode (digests Pillow recorded in
// expected.json, see tools/scripts/make_decode_fixtures.py), and bad input of every kind.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "vision/image_decode.h"

namespace iris::vision {
namespace {

using ::iris::testing::DataPath;
using ::iris::testing::LoadGolden;
using ::testing::HasSubstr;

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

nlohmann::json ReadJson(const std::string& relative) {
  std::ifstream f(DataPath(relative));
  EXPECT_TRUE(f.good()) << relative;
  return nlohmann::json::parse(f);
}

std::string Digest(const RgbImage& im) { return core::Sha256Hex(im.pixels.data(), im.pixels.size()); }

void ExpectShape(const RgbImage& im, const nlohmann::json& shape_hwc) {
  ASSERT_EQ(shape_hwc.size(), 3u);
  EXPECT_EQ(im.height, shape_hwc[0].get<int>());
  EXPECT_EQ(im.width, shape_hwc[1].get<int>());
  EXPECT_EQ(shape_hwc[2].get<int>(), 3);
  EXPECT_EQ(im.pixels.size(), static_cast<size_t>(im.width) * im.height * 3);
}

// ---------------------------------------------------------------------------------------------
// Goldens: every image of tests/data/images, as the preprocess manifest records it.

TEST(ImageDecodeGoldenTest, EveryGoldenImageMatchesLoadImage) {
  const nlohmann::json manifest = ReadJson("preprocess/manifest.json");
  int checked = 0, crops = 0;
  for (const auto& c : manifest["cases"]) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const auto decoded = DecodeImageFile(DataPath(c["image"].get<std::string>()));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectShape(*decoded, c["load_image"]["rgb_shape_hwc"]);
    EXPECT_EQ(Digest(*decoded), c["load_image"]["rgb_uint8_sha256"].get<std::string>());
    ++checked;
    if (!c.contains("arrays")) continue;
    const std::string file = c["arrays"]["file"];
    for (const auto& [name, spec] : c["arrays"]["tensors"].items()) {
      if (name.rfind("decoded_rgb", 0) != 0) continue;
      SCOPED_TRACE(name);
      const core::Tensor golden = LoadGolden(file, name);
      ASSERT_EQ(golden.dtype(), core::DType::kU8);
      int y0 = 0, x0 = 0;
      if (name != "decoded_rgb") {  // "32x32 crop of the decoded uint8 RGB image at (y,x)=[84, 134]"
        const std::string desc = spec["desc"];
        const size_t at = desc.find("(y,x)=[");
        ASSERT_NE(at, std::string::npos) << desc;
        ASSERT_EQ(std::sscanf(desc.c_str() + at, "(y,x)=[%d, %d]", &y0, &x0), 2) << desc;
      }
      const int h = static_cast<int>(golden.dim(0)), w = static_cast<int>(golden.dim(1));
      ASSERT_LE(y0 + h, decoded->height);
      ASSERT_LE(x0 + w, decoded->width);
      const uint8_t* g = golden.data<uint8_t>();
      int mismatches = 0;
      for (int y = 0; y < h; ++y) {
        mismatches += std::memcmp(decoded->row(y0 + y) + 3 * x0, g + static_cast<size_t>(y) * w * 3, w * 3) != 0;
      }
      EXPECT_EQ(mismatches, 0) << "rows differ from the stored crop";
      ++crops;
    }
  }
  EXPECT_EQ(checked, 16);
  EXPECT_GE(crops, 20);
}

TEST(ImageDecodeGoldenTest, ProbeReportsStoredDimensions) {
  const nlohmann::json manifest = ReadJson("preprocess/manifest.json");
  for (const auto& c : manifest["cases"]) {
    SCOPED_TRACE(c["case"].get<std::string>());
    const std::vector<uint8_t> bytes = ReadFile(DataPath(c["image"].get<std::string>()));
    const auto header = ProbeImage(bytes);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->format, c["file"]["format"] == "PNG" ? ImageFormat::kPng : ImageFormat::kJpeg);
    EXPECT_EQ(header->width, c["file"]["size_wh"][0].get<int>());  // before EXIF rotation
    EXPECT_EQ(header->height, c["file"]["size_wh"][1].get<int>());
  }
}

// ---------------------------------------------------------------------------------------------
// tests/data/decode: what Pillow did with each fixture (or what iris does instead, and why).

struct FixtureCase {
  std::string file;
  std::string desc;
  nlohmann::json expect;  // {"ok": true, "shape_hwc": [...], "sha256": ...} or {"ok": false}
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.file; }

std::vector<FixtureCase> LoadFixtureCases() {
  std::vector<FixtureCase> cases;
  std::ifstream f(std::string(IRIS_TEST_DATA) + "/decode/expected.json");
  if (!f.good()) return cases;
  const nlohmann::json j = nlohmann::json::parse(f);
  for (const auto& c : j["cases"]) {
    cases.push_back({c["file"], c["desc"], c.contains("iris") ? c["iris"] : c["pil"]});
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<FixtureCase>& info) {
  std::string name = info.param.file;
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

class DecodeFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(DecodeFixtureTest, MatchesReference) {
  const FixtureCase& c = GetParam();
  SCOPED_TRACE(c.desc);
  const auto decoded = DecodeImageFile(DataPath("decode/" + c.file));
  if (c.expect["ok"].get<bool>()) {
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectShape(*decoded, c.expect["shape_hwc"]);
    if (!c.expect["sha256"].is_null()) {  // null: a documented difference from Pillow (see "why")
      EXPECT_EQ(Digest(*decoded), c.expect["sha256"].get<std::string>());
    }
  } else {
    ASSERT_FALSE(decoded.ok()) << "decoded " << decoded->width << "x" << decoded->height;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << decoded.status();
    EXPECT_FALSE(decoded.status().message().empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Pillow94, DecodeFixtureTest, ::testing::ValuesIn(LoadFixtureCases()), CaseName);

TEST(DecodeFixtureListTest, CoversEveryKind) {
  const std::vector<FixtureCase> cases = LoadFixtureCases();
  EXPECT_GE(cases.size(), 120u);
  auto count = [&](const char* prefix) {
    return std::count_if(cases.begin(), cases.end(), [&](const FixtureCase& c) { return c.file.rfind(prefix, 0) == 0; });
  };
  EXPECT_GE(count("exif_"), 30);
  EXPECT_GE(count("png_"), 40);
  EXPECT_GE(count("webp_"), 4);
  EXPECT_GE(count("bmp_"), 3);
  EXPECT_GE(count("tiff_"), 5);
}

// ---------------------------------------------------------------------------------------------
// Bad input: each a clear InvalidArgument.

absl::Status DecodeStatus(const std::vector<uint8_t>& bytes, const DecodeLimits& limits = {}) {
  return DecodeImage(bytes, limits).status();
}

void ExpectInvalid(const absl::Status& s, const std::string& substring) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(substring));
}

TEST(ImageDecodeErrorTest, EmptyInput) {
  ExpectInvalid(DecodeStatus({}), "image is 0 bytes");
  ExpectInvalid(ProbeImage({}).status(), "image is 0 bytes");
}

TEST(ImageDecodeErrorTest, OverMaxBytes) {
  const std::vector<uint8_t> png = ReadFile(DataPath("images/rgb_300x200.png"));
  DecodeLimits limits;
  limits.max_bytes = 1000;
  ExpectInvalid(DecodeStatus(png, limits), "image is " + std::to_string(png.size()) + " bytes, limit is 1000");
  ExpectInvalid(DecodeImageFile(DataPath("images/rgb_300x200.png"), limits).status(),
                "is " + std::to_string(png.size()) + " bytes, limit is 1000");
  limits.max_bytes = static_cast<int64_t>(png.size());
  EXPECT_TRUE(DecodeImage(png, limits).ok());
}

TEST(ImageDecodeErrorTest, TruncatedJpeg) {
  std::vector<uint8_t> jpeg = ReadFile(DataPath("images/jpeg420_q90_1000x667.jpg"));
  jpeg.resize(jpeg.size() / 2);
  ExpectInvalid(DecodeStatus(jpeg), "JPEG data is truncated");
  // Progressive: all scans are read before output starts.
  std::vector<uint8_t> prog = ReadFile(DataPath("images/progressive_q90_300x200.jpg"));
  prog.resize(prog.size() * 3 / 4);
  ExpectInvalid(DecodeStatus(prog), "JPEG data is truncated");
  // Only the EOI marker missing: Pillow calls that truncated too.
  ExpectInvalid(DecodeImageFile(DataPath("decode/jpeg_no_eoi.jpg")).status(), "JPEG data is truncated");
}

TEST(ImageDecodeErrorTest, CorruptJpeg) {
  ExpectInvalid(DecodeImageFile(DataPath("decode/jpeg_corrupt_scan.jpg")).status(), "invalid JPEG data (libjpeg: ");
  // SOI then nothing usable.
  ExpectInvalid(DecodeStatus({0xFF, 0xD8, 0xFF, 0xD9}), "EOI before any frame header");
  ExpectInvalid(DecodeStatus({0xFF, 0xD8, 0xFF, 0xE0, 0x00}), "JPEG data is truncated");
}

TEST(ImageDecodeErrorTest, GarbageBytes) {
  std::vector<uint8_t> garbage(300);
  uint32_t s = 12345;
  for (auto& b : garbage) b = static_cast<uint8_t>((s = s * 1103515245 + 12345) >> 16);
  garbage[0] = 0x13;
  ExpectInvalid(DecodeStatus(garbage), "unsupported image format (first bytes 13 ");
}

TEST(ImageDecodeErrorTest, UnsupportedFormatsAreNamed) {
  ExpectInvalid(DecodeImageFile(DataPath("decode/gif_8x8.gif")).status(),
                "unsupported image format (first bytes 47 49 46 38: GIF)");
  const std::string heic = std::string("\0\0\0\x18" "ftypheic", 12) + std::string(20, '\0');
  ExpectInvalid(DecodeStatus(std::vector<uint8_t>(heic.begin(), heic.end())), ": HEIF)");
  ExpectInvalid(DecodeStatus({'B'}), "unsupported image format (first bytes 42)");
}

TEST(ImageDecodeErrorTest, HugePngHeader) {
  const auto s = DecodeImageFile(DataPath("decode/png_huge_header.png")).status();
  ExpectInvalid(s, "PNG header declares 100000x100000 = 10000000000 pixels, limit is 67108864");
  // The probe itself is fine: it only reads the header.
  const auto header = ProbeImage(ReadFile(DataPath("decode/png_huge_header.png")));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->width, 100000);
  EXPECT_EQ(header->height, 100000);
}

TEST(ImageDecodeErrorTest, HugeHeadersOfEveryFormat) {
  ExpectInvalid(DecodeImageFile(DataPath("decode/jpeg_huge_header.jpg")).status(),
                "JPEG header declares 60000x60000 = 3600000000 pixels, limit is 67108864");
  ExpectInvalid(DecodeImageFile(DataPath("decode/bmp_huge_header.bmp")).status(),
                "BMP header declares 50000x50000 = 2500000000 pixels, limit is 67108864");
  ExpectInvalid(DecodeImageFile(DataPath("decode/tiff_huge_header.tif")).status(),
                "TIFF header declares 70000x70000 = 4900000000 pixels, limit is 67108864");
  // A WebP (VP8X) canvas of 16384x16384.
  std::vector<uint8_t> webp = ReadFile(DataPath("decode/webp_lossy_alpha_41x27.webp"));
  ASSERT_EQ(std::string(webp.begin() + 12, webp.begin() + 16), "VP8X");
  webp[24] = webp[25] = 0xFF, webp[26] = 0x3F;
  webp[27] = webp[28] = 0xFF, webp[29] = 0x3F;
  ExpectInvalid(DecodeStatus(webp), "WebP header declares 4194304x4194304 = ");
}

TEST(ImageDecodeErrorTest, SideAndPixelLimits) {
  const std::vector<uint8_t> png = ReadFile(DataPath("images/rgb_300x200.png"));
  DecodeLimits limits;
  limits.max_side = 299;
  ExpectInvalid(DecodeStatus(png, limits), "PNG header declares 300x200, a side over the limit of 299");
  limits = {};
  limits.max_pixels = 59999;
  ExpectInvalid(DecodeStatus(png, limits), "PNG header declares 300x200 = 60000 pixels, limit is 59999");
  limits.max_pixels = 60000;
  EXPECT_TRUE(DecodeImage(png, limits).ok());
  const std::vector<uint8_t> jpeg = ReadFile(DataPath("images/exif6_640x480.jpg"));
  limits = {};
  limits.max_side = 600;  // stored 640x480, decoded 480x640: the stored size is what is checked
  ExpectInvalid(DecodeStatus(jpeg, limits), "JPEG header declares 640x480, a side over the limit of 600");
  for (const char* file : {"decode/webp_lossy_41x27.webp", "decode/bmp_rgb24_23x11.bmp", "decode/tiff_rgb_raw_21x14.tif"}) {
    SCOPED_TRACE(file);
    limits = {};
    limits.max_pixels = 100;
    ExpectInvalid(DecodeStatus(ReadFile(DataPath(file)), limits), "pixels, limit is 100");
  }
}

TEST(ImageDecodeErrorTest, TruncatedPng) {
  ExpectInvalid(DecodeImageFile(DataPath("decode/png_truncated_idat.png")).status(), "PNG data is truncated");
  std::vector<uint8_t> png = ReadFile(DataPath("images/rgb_448x448.png"));
  png.resize(png.size() / 2);
  ExpectInvalid(DecodeStatus(png), "PNG data is truncated (");
  std::vector<uint8_t> header_only = ReadFile(DataPath("images/rgb_448x448.png"));
  header_only.resize(40);
  ExpectInvalid(DecodeStatus(header_only), "PNG data is truncated before the image data");
  header_only.resize(20);
  ExpectInvalid(DecodeStatus(header_only), "PNG header is truncated (the image is only 20 bytes)");
  // Interlaced: stops in some pass.
  std::vector<uint8_t> inter = ReadFile(DataPath("decode/png_ct6_16bit_interlaced_19x13.png"));
  inter.resize(inter.size() - 200);
  ExpectInvalid(DecodeStatus(inter), "PNG data is truncated (interlaced image stops in pass");
}

TEST(ImageDecodeErrorTest, CorruptPng) {
  ExpectInvalid(DecodeImageFile(DataPath("decode/png_bad_ihdr_crc.png")).status(),
                "invalid PNG data (libpng: IHDR: CRC error)");
  ExpectInvalid(DecodeImageFile(DataPath("decode/png_corrupt_idat.png")).status(), "invalid PNG data (libpng: ");
  // Pillow does not check CRCs from the first IDAT on, and neither do we.
  EXPECT_TRUE(DecodeImageFile(DataPath("decode/png_bad_idat_crc.png")).ok());
  std::vector<uint8_t> bad_depth = ReadFile(DataPath("images/rgb_300x200.png"));
  bad_depth[24] = 3;  // bit depth 3 (the IHDR CRC is not even looked at)
  ExpectInvalid(DecodeStatus(bad_depth), "invalid PNG data: bit depth 3 with colour type 2");
}

TEST(ImageDecodeErrorTest, MissingFile) {
  const auto s = DecodeImageFile(DataPath("decode/no_such_file.png")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot open image file"));
}

TEST(ImageDecodeErrorTest, CorruptOpenCvFormats) {
  for (const char* file : {"decode/webp_lossy_41x27.webp", "decode/bmp_rgb24_23x11.bmp", "decode/tiff_rgb_lzw_21x14.tif"}) {
    SCOPED_TRACE(file);
    std::vector<uint8_t> bytes = ReadFile(DataPath(file));
    bytes.resize(bytes.size() / 2);
    const auto s = DecodeStatus(bytes);
    // BMP/TIFF readers may fill missing rows; they must not crash. WebP refuses.
    if (std::string(file).find("webp") != std::string::npos) ExpectInvalid(s, "invalid WebP data (OpenCV");
  }
}

// A WebP that OpenCV's WebP decoder would not claim (its header fails libwebp's WebPGetFeatures)
// must stop at iris's header check: cv::imdecode offered the image_fuzzer's find — a VP8L chunk
// larger than its RIFF, "DICM" at byte 128 — to OpenCV's DICOM reader, which aborted the process.
TEST(ImageDecodeErrorTest, WebpHeadersOpenCvsWebpDecoderWouldNotClaimAreRefused) {
  // (tests/fuzz/corpus/image_fuzzer/webp_vp8l_chunk_past_riff_dicm_at_128.webp)
  const std::vector<uint8_t> found = {
      0x52, 0x49, 0x46, 0x46, 0xec, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50, 0x38, 0x4c,
      0xde, 0xff, 0xff, 0xfc, 0x2f, 0x27, 0x8a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x4b,
      0x88, 0xe8, 0x3f, 0x73, 0x7f, 0x0a, 0xe5, 0x8f, 0xfe, 0x47, 0x32, 0x32, 0x32, 0xff, 0xc0, 0x00,
      0x11, 0x08, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0xff, 0xc4, 0x00, 0x11, 0x01, 0x03, 0x11, 0x00,
      0x00, 0x00, 0x01, 0x02, 0x03, 0x5a, 0x63, 0x64, 0x02, 0x77, 0x00, 0x01, 0x02, 0x03, 0x11, 0x04,
      0x05, 0x21, 0x31, 0x06, 0x12, 0x41, 0x51, 0xb0, 0x70, 0xdb, 0x36, 0x92, 0xfd, 0xde, 0x50, 0x56,
      0x50, 0x38, 0x4c, 0xde, 0xff, 0xff, 0xfc, 0x25, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x3f,
      0x50, 0x44, 0x46, 0xb0, 0xe0, 0x8c, 0xcd, 0x96, 0xa0, 0x30, 0x0c, 0x98, 0xac, 0x03, 0x1e, 0x17,
      0x44, 0x49, 0x43, 0x4d, 0x9c, 0x89,
  };
  ExpectInvalid(DecodeStatus(found), "invalid WebP data: VP8L chunk of 4244635614 bytes in a RIFF of 236");
  const std::vector<uint8_t> lossy = ReadFile(DataPath("decode/webp_lossy_41x27.webp"));
  ASSERT_EQ(std::string(lossy.begin() + 12, lossy.begin() + 16), "VP8 ");
  std::vector<uint8_t> b = lossy;
  b[4] = 11, b[5] = b[6] = b[7] = 0;  // a RIFF size under its own header's
  ExpectInvalid(DecodeStatus(b), "invalid WebP data: RIFF size 11, under 12");
  b = lossy;
  b[20] |= 1;  // an inter frame
  ExpectInvalid(DecodeStatus(b), "invalid WebP data: bad VP8 frame tag");
  std::vector<uint8_t> lossless = ReadFile(DataPath("decode/webp_lossless_alpha_41x27.webp"));
  ASSERT_EQ(std::string(lossless.begin() + 12, lossless.begin() + 16), "VP8L");
  lossless[24] |= 0x20;  // version 1
  ExpectInvalid(DecodeStatus(lossless), "invalid WebP data: bad VP8L signature or version");
  std::vector<uint8_t> extended = ReadFile(DataPath("decode/webp_lossy_alpha_41x27.webp"));
  ASSERT_EQ(std::string(extended.begin() + 12, extended.begin() + 16), "VP8X");
  extended[16] = 11;
  ExpectInvalid(DecodeStatus(extended), "invalid WebP data: VP8X chunk of 11 bytes, not 10");
  // The files themselves still decode.
  for (const auto* f : {"decode/webp_lossy_41x27.webp", "decode/webp_lossless_alpha_41x27.webp",
                        "decode/webp_lossy_alpha_41x27.webp"}) {
    EXPECT_TRUE(DecodeImageFile(DataPath(f)).ok()) << f;
  }
}

// Every prefix and a few thousand single-byte corruptions of small files of each format:
// whatever happens must be a status, never a crash (and, under ASan, never a bad access or leak).
TEST(ImageDecodeRobustnessTest, PrefixesAndCorruptionsNeverCrash) {
  const char* files[] = {"decode/jpeg420_37x23.jpg", "decode/jpeg_cmyk_adobe_40x30.jpg",
                         "decode/jpeg420_progressive_50x30.jpg", "decode/exif_ii_o6_48x32.jpg",
                         "decode/png_palette4_interlaced_19x13.png", "decode/png_gray16_19x13.png",
                         "decode/png_exif_o6_pre_idat.png", "decode/webp_lossy_41x27.webp",
                         "decode/webp_lossless_alpha_41x27.webp", "decode/bmp_pal8_23x11.bmp",
                         "decode/tiff_rgb_lzw_21x14.tif"};
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto next = [&] { return (rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  DecodeLimits limits;
  limits.max_pixels = 1 << 16;
  int ok = 0, failed = 0;
  for (const char* file : files) {
    SCOPED_TRACE(file);
    const std::vector<uint8_t> bytes = ReadFile(DataPath(file));
    const size_t step = std::max<size_t>(1, bytes.size() / 150);
    for (size_t n = 0; n < bytes.size(); n += step) {
      const auto r = DecodeImage(std::span(bytes.data(), n), limits);
      (r.ok() ? ok : failed)++;
      if (!r.ok()) {
        EXPECT_FALSE(r.status().message().empty());
      }
    }
    for (int i = 0; i < 150; ++i) {
      std::vector<uint8_t> mutated = bytes;
      const int edits = 1 + static_cast<int>(next() % 4);
      for (int e = 0; e < edits; ++e) mutated[next() % mutated.size()] = static_cast<uint8_t>(next());
      const auto r = DecodeImage(mutated, limits);
      (r.ok() ? ok : failed)++;
      if (r.ok()) {
        EXPECT_EQ(r->pixels.size(), static_cast<size_t>(r->width) * r->height * 3);
      }
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(ok, 0);
}

// ---------------------------------------------------------------------------------------------
// Probing and concurrency.

TEST(ImageProbeTest, EveryFormat) {
  struct Want {
    const char* file;
    ImageFormat format;
    int width, height;
  };
  const Want wants[] = {
      {"decode/jpeg_cmyk_adobe_40x30.jpg", ImageFormat::kJpeg, 40, 30},
      {"decode/exif_ii_o6_48x32.jpg", ImageFormat::kJpeg, 48, 32},
      {"decode/png_gray2_interlaced_19x13.png", ImageFormat::kPng, 19, 13},
      {"decode/webp_lossy_41x27.webp", ImageFormat::kWebp, 41, 27},
      {"decode/webp_lossless_alpha_41x27.webp", ImageFormat::kWebp, 41, 27},
      {"decode/webp_lossy_alpha_41x27.webp", ImageFormat::kWebp, 41, 27},
      {"decode/bmp_rgb24_23x11.bmp", ImageFormat::kBmp, 23, 11},
      {"decode/bmp_topdown_23x11.bmp", ImageFormat::kBmp, 23, 11},
      {"decode/tiff_rgb_lzw_21x14.tif", ImageFormat::kTiff, 21, 14},
      {"decode/tiff_rgb_o6_21x14.tif", ImageFormat::kTiff, 21, 14},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.file);
    const auto h = ProbeImage(ReadFile(DataPath(w.file)));
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->format, w.format);
    EXPECT_EQ(h->width, w.width);
    EXPECT_EQ(h->height, w.height);
    EXPECT_STRNE(ImageFormatName(h->format), "unknown");
  }
}

TEST(ImageDecodeConcurrencyTest, ThreadsDecodeIndependently) {
  const nlohmann::json manifest = ReadJson("preprocess/manifest.json");
  std::vector<std::pair<std::vector<uint8_t>, std::string>> inputs;
  for (const auto& c : manifest["cases"]) {
    inputs.emplace_back(ReadFile(DataPath(c["image"].get<std::string>())), c["load_image"]["rgb_uint8_sha256"]);
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < inputs.size() * 2; i += 4) {
        const auto& [bytes, digest] = inputs[i % inputs.size()];
        const auto r = DecodeImage(bytes);
        if (!r.ok() || Digest(*r) != digest) ++mismatches[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

// WebP, BMP and TIFF go through the OpenCV plugin, loaded on first use: where it cannot be
// loaded, those formats get a clear UNIMPLEMENTED naming the plugin and where it was looked for,
// while JPEG and PNG (iris's own decoders) are unaffected. In a fresh process (the loader keeps
// its first answer), with IRIS_OPENCV_PLUGIN naming a file that is not there.
TEST(ImageDecodePluginDeathTest, WithoutThePluginOnlyItsFormatsAreRefusedClearly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::vector<uint8_t> bmp = ReadFile(DataPath("decode/bmp_gray8_23x11.bmp"));
  const std::vector<uint8_t> png = ReadFile(DataPath("images/rgb_300x200.png"));
  EXPECT_EXIT(
      {
        setenv("IRIS_OPENCV_PLUGIN", "/nonexistent/libiris_opencv_plugin.so", 1);
        const absl::Status refused = DecodeStatus(bmp);
        const bool clear = refused.code() == absl::StatusCode::kUnimplemented &&
                           refused.message().find("libiris_opencv_plugin.so") != std::string_view::npos &&
                           refused.message().find("/nonexistent/libiris_opencv_plugin.so: not there") !=
                               std::string_view::npos;
        std::fprintf(stderr, "%s\n", refused.ToString().c_str());
        std::exit(clear && DecodeStatus(png).ok() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "OpenCV plugin");
}

}  // namespace
}  // namespace iris::vision
