#include "vision/image_header.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace iris::vision::detail {
namespace {

bool StartsWith(std::span<const uint8_t> b, const char* magic, size_t n, size_t at = 0) {
  return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
}

uint32_t Be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t Be32(const uint8_t* p) { return (Be16(p) << 16) | Be16(p + 2); }
uint32_t Le16(const uint8_t* p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }
uint32_t Le24(const uint8_t* p) { return Le16(p) | (uint32_t{p[2]} << 16); }
uint32_t Le32(const uint8_t* p) { return Le16(p) | (Le16(p + 2) << 16); }

absl::Status Truncated(const char* format, size_t size) {
  return absl::InvalidArgumentError(
      absl::StrCat(format, " header is truncated (the image is only ", size, " bytes)"));
}

// Formats we recognise only to name them in the error.
const char* KnownUnsupported(std::span<const uint8_t> b) {
  if (StartsWith(b, "GIF87a", 6) || StartsWith(b, "GIF89a", 6)) return "GIF";
  if (StartsWith(b, "\x00\x00\x01\x00", 4)) return "ICO";
  if (StartsWith(b, "8BPS", 4)) return "PSD";
  if (StartsWith(b, "\x00\x00\x00\x0cjP  ", 8) || StartsWith(b, "\xff\x4f\xff\x51", 4)) return "JPEG 2000";
  if (StartsWith(b, "ftyp", 4, 4)) {
    if (StartsWith(b, "avif", 4, 8) || StartsWith(b, "avis", 4, 8)) return "AVIF";
    if (StartsWith(b, "heic", 4, 8) || StartsWith(b, "heix", 4, 8) || StartsWith(b, "mif1", 4, 8) ||
        StartsWith(b, "msf1", 4, 8)) {
      return "HEIF";
    }
    return "ISO media (MP4/MOV/HEIF family)";
  }
  if (StartsWith(b, "RIFF", 4)) return "RIFF, not WebP";
  if (StartsWith(b, "%PDF", 4)) return "PDF";
  if (StartsWith(b, "<svg", 4) || StartsWith(b, "<?xml", 5)) return "SVG/XML";
  if (StartsWith(b, "qoif", 4)) return "QOI";
  if (StartsWith(b, "\x76\x2f\x31\x01", 4)) return "OpenEXR";
  if (StartsWith(b, "\xff\x0a", 2) || StartsWith(b, "\x00\x00\x00\x0cJXL ", 8)) return "JPEG XL";
  if (StartsWith(b, "\xff\xd8", 2)) return "JPEG without a marker after SOI";
  return nullptr;
}

bool IsSof(int marker) {
  // SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

}  // namespace

ImageFormat SniffFormat(std::span<const uint8_t> b) {
  if (StartsWith(b, "\xff\xd8\xff", 3)) return ImageFormat::kJpeg;
  if (StartsWith(b, "\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (StartsWith(b, "RIFF", 4) && StartsWith(b, "WEBP", 4, 8)) return ImageFormat::kWebp;
  if (StartsWith(b, "BM", 2)) return ImageFormat::kBmp;
  if (StartsWith(b, "II*\0", 4) || StartsWith(b, "MM\0*", 4) || StartsWith(b, "II+\0", 4) ||
      StartsWith(b, "MM\0+", 4)) {
    return ImageFormat::kTiff;
  }
  return ImageFormat::kUnknown;
}

absl::Status UnsupportedFormatError(std::span<const uint8_t> b) {
  std::string hex;
  for (size_t i = 0; i < b.size() && i < 4; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x", b[i]);
    absl::StrAppend(&hex, i ? " " : "", buf);
  }
  const char* name = KnownUnsupported(b);
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported image format (first bytes ", hex, name ? ": " : "", name ? name : "",
      "); supported: JPEG, PNG, WebP, BMP, TIFF"));
}

absl::StatusOr<HeaderDims> ReadJpegDims(std::span<const uint8_t> b) {
  // Walk the markers after SOI up to the first SOFn, as Pillow's JpegImagePlugin does (junk
  // between markers is skipped).
  size_t pos = 2;
  const size_t n = b.size();
  while (pos < n) {
    if (b[pos] != 0xFF) {
      ++pos;
      continue;
    }
    while (pos < n && b[pos] == 0xFF) ++pos;  // fill bytes
    if (pos >= n) break;
    const int marker = b[pos++];
    if (marker == 0x00 || marker == 0x01 || marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7)) {
      continue;  // stuffed byte, TEM, SOI, RSTn: no length
    }
    if (marker == 0xD9 || marker == 0xDA) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid JPEG data: ", marker == 0xD9 ? "EOI" : "start of scan", " before any frame header"));
    }
    if (pos + 2 > n) break;
    const size_t length = Be16(&b[pos]);
    if (length < 2) return absl::InvalidArgumentError("invalid JPEG data: marker segment length < 2");
    if (IsSof(marker)) {
      if (pos + 7 > n) break;
      return HeaderDims{Be16(&b[pos + 5]), Be16(&b[pos + 3])};
    }
    pos += length;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("JPEG data is truncated: no frame header in ", n, " bytes"));
}

absl::StatusOr<PngIhdr> ReadPngIhdr(std::span<const uint8_t> b) {
  if (b.size() < 33) return Truncated("PNG", b.size());
  if (Be32(&b[8]) != 13 || std::memcmp(&b[12], "IHDR", 4) != 0) {
    return absl::InvalidArgumentError("invalid PNG data: the first chunk is not a 13-byte IHDR");
  }
  PngIhdr h;
  h.width = Be32(&b[16]);
  h.height = Be32(&b[20]);
  h.bit_depth = b[24];
  h.color_type = b[25];
  h.interlaced = b[28] != 0;
  return h;
}

// Besides the dimensions, the header checks libwebp's WebPGetFeatures makes on a file's first 32
// bytes, which is how OpenCV's WebP decoder claims a buffer: a WebP it would not claim went on to
// OpenCV's other decoders (GDCM aborted the process on one that had "DICM" at byte 128).
absl::StatusOr<HeaderDims> ReadWebpDims(std::span<const uint8_t> b) {
  if (b.size() < 30) return Truncated("WebP", b.size());
  const uint32_t riff_size = Le32(&b[4]), chunk_size = Le32(&b[16]);
  if (riff_size < 12) {
    return absl::InvalidArgumentError(absl::StrCat("invalid WebP data: RIFF size ", riff_size, ", under 12"));
  }
  const uint8_t* c = &b[12];
  if (std::memcmp(c, "VP8X", 4) == 0) {
    if (chunk_size != 10) {
      return absl::InvalidArgumentError(absl::StrCat("invalid WebP data: VP8X chunk of ", chunk_size, " bytes, not 10"));
    }
    return HeaderDims{int64_t{Le24(&b[24])} + 1, int64_t{Le24(&b[27])} + 1};
  }
  const bool lossless = std::memcmp(c, "VP8L", 4) == 0;
  if ((lossless || std::memcmp(c, "VP8 ", 4) == 0) && chunk_size > riff_size - 12) {
    return absl::InvalidArgumentError(absl::StrCat("invalid WebP data: ", lossless ? "VP8L" : "VP8", " chunk of ",
                                                   chunk_size, " bytes in a RIFF of ", riff_size));
  }
  if (lossless) {
    if (b[20] != 0x2F || (b[24] >> 5) != 0) {
      return absl::InvalidArgumentError("invalid WebP data: bad VP8L signature or version");
    }
    const uint32_t bits = Le32(&b[21]);
    return HeaderDims{int64_t{bits & 0x3FFF} + 1, int64_t{(bits >> 14) & 0x3FFF} + 1};
  }
  if (std::memcmp(c, "VP8 ", 4) == 0) {
    if (b[23] != 0x9D || b[24] != 0x01 || b[25] != 0x2A) {
      return absl::InvalidArgumentError("invalid WebP data: bad VP8 key frame start code");
    }
    // The frame tag: a shown key frame of profile 0..3 whose first partition fits in the chunk.
    const uint32_t tag = Le24(&b[20]);
    if ((tag & 1) != 0 || ((tag >> 1) & 7) > 3 || ((tag >> 4) & 1) == 0 || (tag >> 5) >= chunk_size) {
      return absl::InvalidArgumentError("invalid WebP data: bad VP8 frame tag");
    }
    return HeaderDims{Le16(&b[26]) & 0x3FFF, Le16(&b[28]) & 0x3FFF};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid WebP data: first chunk is '", std::string(reinterpret_cast<const char*>(c), 4),
      "', expected VP8, VP8L or VP8X"));
}

bool IsAnimatedWebp(std::span<const uint8_t> b) {
  return b.size() >= 21 && std::memcmp(&b[12], "VP8X", 4) == 0 && (b[20] & 0x02) != 0;
}

absl::StatusOr<HeaderDims> ReadBmpDims(std::span<const uint8_t> b) {
  if (b.size() < 18) return Truncated("BMP", b.size());
  const uint32_t dib = Le32(&b[14]);
  if (dib == 12) {  // BITMAPCOREHEADER: 16-bit sizes
    if (b.size() < 26) return Truncated("BMP", b.size());
    return HeaderDims{Le16(&b[18]), Le16(&b[20])};
  }
  if (dib < 16) return absl::InvalidArgumentError(absl::StrCat("invalid BMP data: DIB header size ", dib));
  if (b.size() < 26) return Truncated("BMP", b.size());
  const int64_t w = static_cast<int32_t>(Le32(&b[18]));
  const int64_t h = static_cast<int32_t>(Le32(&b[22]));  // negative: top-down rows
  if (w < 0) return absl::InvalidArgumentError(absl::StrCat("invalid BMP data: width ", w));
  return HeaderDims{w, h < 0 ? -h : h};
}

absl::StatusOr<TiffInfo> ReadTiffInfo(std::span<const uint8_t> b) {
  if (b.size() < 8) return Truncated("TIFF", b.size());
  const bool le = b[0] == 'I';
  const bool big = b[2] == 0x2B || b[3] == 0x2B;
  auto u16 = [&](uint64_t at) -> uint64_t { return le ? Le16(&b[at]) : Be16(&b[at]); };
  auto u32 = [&](uint64_t at) -> uint64_t { return le ? Le32(&b[at]) : Be32(&b[at]); };
  auto u64 = [&](uint64_t at) -> uint64_t {
    return le ? (u32(at) | (u32(at + 4) << 32)) : ((u32(at) << 32) | u32(at + 4));
  };
  const uint64_t entry_size = big ? 20 : 12, count_size = big ? 8 : 2, inline_size = big ? 8 : 4;
  uint64_t ifd;
  if (big) {
    if (b.size() < 16) return Truncated("TIFF", b.size());
    ifd = u64(8);
  } else {
    ifd = u32(4);
  }
  if (ifd > b.size() || b.size() - ifd < count_size) {
    return absl::InvalidArgumentError("invalid TIFF data: first IFD lies outside the file");
  }
  const uint64_t count = big ? u64(ifd) : u16(ifd);
  TiffInfo info;
  info.width = info.height = -1;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = ifd + count_size + i * entry_size;
    if (at + entry_size > b.size()) break;
    const uint64_t tag = u16(at), type = u16(at + 2);
    const uint64_t n = big ? u64(at + 4) : u32(at + 4);
    if (tag != 256 && tag != 257 && tag != 258 && tag != 262 && tag != 277) continue;
    const int unit = type == 3 ? 2 : type == 4 ? 4 : (type == 16 && big) ? 8 : 0;
    if (unit == 0 || n == 0) {
      if (tag != 256 && tag != 257) continue;
      return absl::InvalidArgumentError(absl::StrCat("invalid TIFF data: tag ", tag, " has type ", type, " and count ", n));
    }
    uint64_t value_at = at + (big ? 12 : 8);
    if (n * unit > inline_size) {  // the first of several values, stored elsewhere
      value_at = big ? u64(value_at) : u32(value_at);
      if (value_at > b.size() || b.size() - value_at < static_cast<uint64_t>(unit)) {
        if (tag != 256 && tag != 257) continue;
        return absl::InvalidArgumentError(absl::StrCat("invalid TIFF data: tag ", tag, " points outside the file"));
      }
    }
    const uint64_t v = unit == 2 ? u16(value_at) : unit == 4 ? u32(value_at) : (u64(value_at) & 0x7FFFFFFFFFFFFFFFull);
    switch (tag) {
      case 256: info.width = static_cast<int64_t>(v); break;
      case 257: info.height = static_cast<int64_t>(v); break;
      case 258: info.bits_per_sample = static_cast<int>(std::min<uint64_t>(v, 1 << 16)); break;
      case 262: info.photometric = static_cast<int>(std::min<uint64_t>(v, 1 << 16)); break;
      case 277: info.samples_per_pixel = static_cast<int>(std::min<uint64_t>(v, 1 << 16)); break;
    }
  }
  if (info.width < 0 || info.height < 0) {
    return absl::InvalidArgumentError("invalid TIFF data: the first IFD has no ImageWidth/ImageLength");
  }
  return info;
}

absl::StatusOr<HeaderDims> ReadTiffDims(std::span<const uint8_t> b) {
  absl::StatusOr<TiffInfo> info = ReadTiffInfo(b);
  if (!info.ok()) return info.status();
  return HeaderDims{info->width, info->height};
}

absl::Status CheckDimensions(ImageFormat format, int64_t width, int64_t height,
                             const DecodeLimits& limits) {
  const char* name = ImageFormatName(format);
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " header declares an empty image (", width, "x", height, ")"));
  }
  // Headers store at most 32 bits per side (BigTIFF aside), so the product fits in uint64.
  constexpr int64_t kMaxSide32 = 0xFFFFFFFFll;
  if (width > kMaxSide32 || height > kMaxSide32) {
    return absl::InvalidArgumentError(absl::StrCat(name, " header declares ", width, "x", height,
                                                   ", a side over the limit of ", limits.max_side));
  }
  const uint64_t pixels = static_cast<uint64_t>(width) * static_cast<uint64_t>(height);
  if (limits.max_pixels < 0 || pixels > static_cast<uint64_t>(limits.max_pixels)) {
    return absl::InvalidArgumentError(absl::StrCat(name, " header declares ", width, "x", height, " = ",
                                                   pixels, " pixels, limit is ", limits.max_pixels));
  }
  if (width > limits.max_side || height > limits.max_side) {
    return absl::InvalidArgumentError(absl::StrCat(name, " header declares ", width, "x", height,
                                                   ", a side over the limit of ", limits.max_side));
  }
  return absl::OkStatus();
}

}  // namespace iris::vision::detail
