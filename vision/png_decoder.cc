#include "vision/png_decoder.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <string_view>
#include <vector>

#include <png.h>

#include "absl/strings/str_cat.h"
#include "vision/exif_orientation.h"
#include "vision/image_header.h"

namespace iris::vision::detail {
namespace {

// What libpng hands over per pixel once our transforms are set.
enum class RowKind {
  kRgb8,    // truecolour (16-bit: high byte, as Pillow's "RGB;16B"; alpha stripped)
  kGray8,   // gray 1..8 bit (expanded by bit replication, as Pillow's L;2/L;4/"1"), gray+alpha
  kGray16,  // 16-bit gray, big-endian: Pillow's mode I, clipped to 255 by convert("RGB")
  kIndex8,  // palette index, one per byte
};

int BytesPerPixel(RowKind k) {
  switch (k) {
    case RowKind::kRgb8: return 3;
    case RowKind::kGray16: return 2;
    default: return 1;
  }
}

// Everything the libpng callbacks touch: plain data only, because libpng's errors longjmp
// through them.
struct PngJob {
  uint32_t width;
  uint32_t height;
  int bit_depth;
  int color_type;
  bool interlaced;
  RowKind kind;
  uint8_t* out;    // width*height*3 RGB
  uint8_t* stage;  // interlaced: rows in libpng's format, combined pass by pass
  size_t stage_stride;
  uint32_t rows_done;  // non-interlaced rows converted
  bool info_seen;
  uint8_t palette[256 * 3];
  char message[256];  // the error that stopped libpng
  char warning[256];  // the last warning once the image data started (zlib trouble is one)
};

PngJob* Job(png_structp png) {
  return static_cast<PngJob*>(png_get_progressive_ptr(png));
}

[[noreturn]] void OnError(png_structp png, png_const_charp message) {
  PngJob* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof job->message, "%s", message);
  png_longjmp(png, 1);
}

// Warnings are not errors (Pillow has none here either); one seen inside the image data explains
// an image that then stops short.
void OnWarning(png_structp png, png_const_charp message) {
  PngJob* job = static_cast<PngJob*>(png_get_error_ptr(png));
  if (job->info_seen) std::snprintf(job->warning, sizeof job->warning, "%s", message);
}

void ConvertRow(const PngJob& job, const uint8_t* src, uint8_t* dst) {
  const uint32_t w = job.width;
  switch (job.kind) {
    case RowKind::kRgb8:
      std::memcpy(dst, src, static_cast<size_t>(w) * 3);
      break;
    case RowKind::kGray8:
      for (uint32_t x = 0; x < w; ++x, dst += 3) dst[0] = dst[1] = dst[2] = src[x];
      break;
    case RowKind::kGray16:
      for (uint32_t x = 0; x < w; ++x, dst += 3) {
        dst[0] = dst[1] = dst[2] = src[2 * x] != 0 ? 255 : src[2 * x + 1];
      }
      break;
    case RowKind::kIndex8:
      for (uint32_t x = 0; x < w; ++x, dst += 3) std::memcpy(dst, job.palette + 3 * src[x], 3);
      break;
  }
}

void OnInfo(png_structp png, png_infop info) {
  PngJob* job = Job(png);
  png_uint_32 w, h;
  int bit_depth, color_type, interlace;
  png_get_IHDR(png, info, &w, &h, &bit_depth, &color_type, &interlace, nullptr, nullptr);
  if (w != job->width || h != job->height || bit_depth != job->bit_depth || color_type != job->color_type ||
      (interlace != PNG_INTERLACE_NONE) != job->interlaced) {
    png_error(png, "IHDR differs from the probed header");
  }
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      if (bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);  // no tRNS expansion
      break;
    case PNG_COLOR_TYPE_PALETTE: {
      if (bit_depth < 8) png_set_packing(png);
      // Pillow's palette starts as a gray ramp; PLTE overwrites its first entries.
      for (int i = 0; i < 256; ++i) job->palette[3 * i] = job->palette[3 * i + 1] = job->palette[3 * i + 2] = static_cast<uint8_t>(i);
      png_colorp plte = nullptr;
      int n = 0;
      if (png_get_PLTE(png, info, &plte, &n) == 0) png_error(png, "palette image without PLTE");
      for (int i = 0; i < n && i < 256; ++i) {
        job->palette[3 * i] = plte[i].red;
        job->palette[3 * i + 1] = plte[i].green;
        job->palette[3 * i + 2] = plte[i].blue;
      }
      break;
    }
    case PNG_COLOR_TYPE_GRAY_ALPHA:
    case PNG_COLOR_TYPE_RGB_ALPHA:
      png_set_strip_alpha(png);
      break;
    default:
      break;
  }
  if (bit_depth == 16 && color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(png);  // high byte
  if (job->interlaced) png_set_interlace_handling(png);
  // Pillow verifies CRCs only for the chunks before the first IDAT.
  png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(job->width) * BytesPerPixel(job->kind)) {
    png_error(png, "unexpected row layout after transforms");
  }
  job->info_seen = true;
}

void OnRow(png_structp png, png_bytep new_row, png_uint_32 row, int /*pass*/) {
  PngJob* job = Job(png);
  if (new_row == nullptr || row >= job->height) return;
  if (job->interlaced) {
    png_progressive_combine_row(png, job->stage + row * job->stage_stride, new_row);
  } else {
    ConvertRow(*job, new_row, job->out + static_cast<size_t>(row) * job->width * 3);
    ++job->rows_done;
  }
}

void OnEnd(png_structp, png_infop) {}

bool Run(png_structp png, png_infop info, const uint8_t* data, size_t size) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_process_data(png, info, const_cast<png_bytep>(data), size);
  return true;
}

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

bool ValidDepth(int color_type, int bit_depth) {
  switch (color_type) {
    case 0: return bit_depth == 1 || bit_depth == 2 || bit_depth == 4 || bit_depth == 8 || bit_depth == 16;
    case 3: return bit_depth == 1 || bit_depth == 2 || bit_depth == 4 || bit_depth == 8;
    case 2: case 4: case 6: return bit_depth == 8 || bit_depth == 16;
    default: return false;
  }
}

// bytes.fromhex("".join(text.split("\n")[3:])): ImageMagick's "Raw profile type exif".
bool DecodeRawProfile(std::string_view text, std::vector<uint8_t>* out) {
  for (int i = 0; i < 3; ++i) {
    const size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return false;  // fewer than 4 lines: nothing to decode
    text.remove_prefix(nl + 1);
  }
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  for (size_t i = 0; i < text.size();) {
    if (space(text[i])) {
      ++i;
      continue;
    }
    if (i + 1 >= text.size() || hex(text[i]) < 0 || hex(text[i + 1]) < 0) return false;  // ValueError
    out->push_back(static_cast<uint8_t>(hex(text[i]) * 16 + hex(text[i + 1])));
    i += 2;
  }
  return true;
}

// Pillow's info["exif"] from eXIf chunks: the last one before the first IDAT, or else the last
// one after it. (libpng 1.6's progressive reader does not handle eXIf, so we walk the chunks.)
std::span<const uint8_t> FindExifChunk(std::span<const uint8_t> b) {
  std::span<const uint8_t> before, after;
  bool seen_idat = false;
  size_t pos = 8;
  while (pos + 12 <= b.size()) {
    const uint32_t length = (uint32_t{b[pos]} << 24) | (uint32_t{b[pos + 1]} << 16) | (uint32_t{b[pos + 2]} << 8) | b[pos + 3];
    const uint8_t* type = &b[pos + 4];
    if (length > b.size() - pos - 12) break;  // truncated chunk
    if (std::memcmp(type, "IDAT", 4) == 0) seen_idat = true;
    if (std::memcmp(type, "IEND", 4) == 0) break;
    if (std::memcmp(type, "eXIf", 4) == 0) (seen_idat ? after : before) = b.subspan(pos + 8, length);
    pos += 12 + static_cast<size_t>(length);
  }
  return before.data() != nullptr ? before : after;
}

// Pillow's getexif() for PNG: info["exif"] (eXIf), else "Raw profile type exif" text; then, if
// IFD0 has no orientation entry, XMP's tiff:Orientation.
int PngOrientation(std::span<const uint8_t> bytes, png_structp png, png_infop info) {
  OrientationTag tag;
  png_textp texts = nullptr;
  const int num_texts = png_get_text(png, info, &texts, nullptr);
  auto last_text = [&](const char* key) -> const char* {
    const char* found = nullptr;
    for (int i = 0; i < num_texts; ++i) {
      if (texts[i].key != nullptr && texts[i].text != nullptr && std::strcmp(texts[i].key, key) == 0) found = texts[i].text;
    }
    return found;
  };
  if (const std::span<const uint8_t> exif = FindExifChunk(bytes); exif.data() != nullptr) {
    tag = ReadExifOrientation(exif);
  } else if (const char* raw = last_text("Raw profile type exif")) {
    std::vector<uint8_t> decoded;
    if (DecodeRawProfile(raw, &decoded)) tag = ReadExifOrientation(decoded);
  }
  if (tag.present) return tag.value;
  if (const char* xmp = last_text("XML:com.adobe.xmp")) {
    const int v = ReadXmpOrientation(xmp);
    if (v >= 2 && v <= 8) return v;
  }
  return 1;
}

}  // namespace

absl::StatusOr<RgbImage> DecodePng(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                                   int* orientation) {
  *orientation = 1;
  absl::StatusOr<PngIhdr> ihdr = ReadPngIhdr(bytes);
  if (!ihdr.ok()) return ihdr.status();
  if (absl::Status s = CheckDimensions(ImageFormat::kPng, ihdr->width, ihdr->height, limits); !s.ok()) return s;
  if (!ValidDepth(ihdr->color_type, ihdr->bit_depth)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid PNG data: bit depth ", ihdr->bit_depth,
                                                   " with colour type ", ihdr->color_type));
  }

  // Plain data for the callbacks; the buffers it points to are owned here.
  PngJob job;
  std::memset(&job, 0, sizeof job);
  job.width = static_cast<uint32_t>(ihdr->width);
  job.height = static_cast<uint32_t>(ihdr->height);
  job.bit_depth = ihdr->bit_depth;
  job.color_type = ihdr->color_type;
  job.interlaced = ihdr->interlaced;
  switch (ihdr->color_type) {
    case 0: job.kind = ihdr->bit_depth == 16 ? RowKind::kGray16 : RowKind::kGray8; break;
    case 3: job.kind = RowKind::kIndex8; break;
    case 4: job.kind = RowKind::kGray8; break;
    default: job.kind = RowKind::kRgb8; break;
  }

  RgbImage image;
  std::vector<uint8_t> stage;
  try {
    image.width = static_cast<int>(job.width);
    image.height = static_cast<int>(job.height);
    image.pixels.resize(static_cast<size_t>(job.width) * job.height * 3);
    job.out = image.pixels.data();
    job.stage_stride = static_cast<size_t>(job.width) * BytesPerPixel(job.kind);
    if (job.interlaced) {
      if (job.kind == RowKind::kRgb8) {
        job.stage = job.out;  // passes combine straight into the result
      } else {
        stage.resize(job.stage_stride * job.height);
        job.stage = stage.data();
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for a ", job.width, "x", job.height, " PNG"));
  }

  PngReader reader;
  reader.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, OnError, OnWarning);
  if (reader.png == nullptr) return absl::ResourceExhaustedError("png_create_read_struct failed");
  reader.info = png_create_info_struct(reader.png);
  if (reader.info == nullptr) return absl::ResourceExhaustedError("png_create_info_struct failed");
  png_set_progressive_read_fn(reader.png, &job, OnInfo, OnRow, OnEnd);
  png_set_user_limits(reader.png, static_cast<png_uint_32>(limits.max_side), static_cast<png_uint_32>(limits.max_side));
  png_set_crc_action(reader.png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);  // until the first IDAT

  const bool ran = Run(reader.png, reader.info, bytes.data(), bytes.size());
  // Complete once every row is in, whatever follows (Pillow ignores trouble after the image data).
  const bool complete = job.info_seen && (job.interlaced ? png_get_current_pass_number(reader.png) >= 7
                                                         : job.rows_done == job.height);
  if (!complete) {
    if (!ran) return absl::InvalidArgumentError(absl::StrCat("invalid PNG data (libpng: ", job.message, ")"));
    if (!job.info_seen) return absl::InvalidArgumentError("PNG data is truncated before the image data");
    if (job.warning[0] != '\0') {
      return absl::InvalidArgumentError(absl::StrCat("invalid PNG data (libpng: ", job.warning, ")"));
    }
    if (job.interlaced) {
      return absl::InvalidArgumentError(absl::StrCat("PNG data is truncated (interlaced image stops in pass ",
                                                     png_get_current_pass_number(reader.png) + 1, " of 7)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("PNG data is truncated (", job.rows_done, " of ", job.height, " rows decoded)"));
  }
  if (job.interlaced && job.kind != RowKind::kRgb8) {
    for (uint32_t y = 0; y < job.height; ++y) {
      ConvertRow(job, job.stage + y * job.stage_stride, job.out + static_cast<size_t>(y) * job.width * 3);
    }
  }
  *orientation = PngOrientation(bytes, reader.png, reader.info);
  return image;
}

}  // namespace iris::vision::detail
