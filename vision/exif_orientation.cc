#include "vision/exif_orientation.h"

#include <cmath>
#include <cstring>
#include <optional>

namespace iris::vision::detail {
namespace {

constexpr uint16_t kOrientationTag = 0x0112;

class Reader {
 public:
  Reader(std::span<const uint8_t> data, bool little_endian) : d_(data), le_(little_endian) {}
  size_t size() const { return d_.size(); }
  bool Has(uint64_t at, uint64_t n) const { return at <= d_.size() && n <= d_.size() - at; }
  const uint8_t* At(uint64_t at) const { return d_.data() + at; }
  uint64_t U(const uint8_t* p, int bytes) const {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{p[le_ ? i : bytes - 1 - i]} << (8 * i);
    return v;
  }

 private:
  std::span<const uint8_t> d_;
  bool le_;
};

// Bytes per value of each TIFF type Pillow 9.4 can load (TiffImagePlugin._load_dispatch);
// 0 for types it skips.
int UnitSize(uint16_t type) {
  switch (type) {
    case 1: case 2: case 6: case 7: return 1;   // BYTE ASCII SBYTE UNDEFINED
    case 3: case 8: return 2;                   // SHORT SSHORT
    case 4: case 9: case 11: case 13: return 4; // LONG SLONG FLOAT IFD
    case 5: case 10: case 12: case 16: return 8; // RATIONAL SRATIONAL DOUBLE LONG8
    default: return 0;
  }
}

// The value Pillow's exif.get(0x0112) compares against {2..8}: the first element of the decoded
// tuple. Returns the matching integer, or nullopt where no dict key can equal it (bytes, str,
// NaN, non-integral numbers).
std::optional<int64_t> FirstValue(const Reader& r, uint16_t type, const uint8_t* p) {
  auto sign = [](uint64_t v, int bits) {
    return static_cast<int64_t>(v << (64 - bits)) >> (64 - bits);
  };
  switch (type) {
    case 3: return static_cast<int64_t>(r.U(p, 2));
    case 4: case 13: return static_cast<int64_t>(r.U(p, 4));
    case 16: {
      const uint64_t v = r.U(p, 8);
      if (v > 8) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    case 6: return sign(r.U(p, 1), 8);
    case 8: return sign(r.U(p, 2), 16);
    case 9: return sign(r.U(p, 4), 32);
    case 5: case 10: {  // IFDRational: Fraction(num, den); den == 0 is NaN
      int64_t num = static_cast<int64_t>(r.U(p, 4));
      int64_t den = static_cast<int64_t>(r.U(p + 4, 4));
      if (type == 10) num = sign(num, 32), den = sign(den, 32);
      if (den == 0 || num % den != 0) return std::nullopt;
      return num / den;
    }
    case 11: case 12: {
      double v;
      if (type == 11) {
        const uint32_t bits = static_cast<uint32_t>(r.U(p, 4));
        float f;
        std::memcpy(&f, &bits, 4);
        v = f;
      } else {
        const uint64_t bits = r.U(p, 8);
        std::memcpy(&v, &bits, 8);
      }
      if (!std::isfinite(v) || v != std::floor(v) || std::fabs(v) > 1e9) return std::nullopt;
      return static_cast<int64_t>(v);
    }
    default:  // BYTE and UNDEFINED load as bytes, ASCII as str: never equal to an int
      return std::nullopt;
  }
}

// TiffImagePlugin.ImageFileDirectory_v2.load over the IFD at `ifd`, keeping only 0x0112.
OrientationTag ScanIfd(const Reader& r, uint64_t ifd, bool big) {
  OrientationTag out;
  const int count_size = big ? 8 : 2, entry_size = big ? 20 : 12, inline_size = big ? 8 : 4;
  if (!r.Has(ifd, count_size)) return out;  // OSError: no tags at all
  const uint64_t count = r.U(r.At(ifd), count_size);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = ifd + count_size + i * entry_size;
    if (!r.Has(at, entry_size)) break;  // OSError ends the scan; earlier tags stay
    const uint8_t* e = r.At(at);
    const uint16_t tag = static_cast<uint16_t>(r.U(e, 2));
    const uint16_t type = static_cast<uint16_t>(r.U(e + 2, 2));
    const uint64_t n = r.U(e + 4, big ? 8 : 4);
    const int unit = UnitSize(type);
    if (unit == 0) continue;  // unsupported type: skipped
    if (n > (uint64_t{1} << 40)) break;  // larger than any block: a short read
    const uint64_t size = n * unit;
    const uint8_t* value = e + (big ? 12 : 8);
    if (size > static_cast<uint64_t>(inline_size)) {
      const uint64_t offset = r.U(value, big ? 8 : 4);
      if (!r.Has(offset, size)) break;  // "Truncated File Read": the scan stops here
      value = r.At(offset);
    }
    if (size == 0) continue;  // `if not data: continue`
    if (tag != kOrientationTag) continue;
    out.present = true;  // a later duplicate overwrites an earlier one
    out.value = 1;
    if (const auto v = FirstValue(r, type, value); v && *v >= 2 && *v <= 8) out.value = static_cast<int>(*v);
  }
  return out;
}

bool HasTiffPrefix(std::span<const uint8_t> d) {
  static const char* kPrefixes[] = {"MM\x00\x2A", "II\x2A\x00", "MM\x2A\x00", "II\x00\x2A",
                                    "MM\x00\x2B", "II\x2B\x00"};
  if (d.size() < 4) return false;
  for (const char* p : kPrefixes) {
    if (std::memcmp(d.data(), p, 4) == 0) return true;
  }
  return false;
}

}  // namespace

OrientationTag ReadExifOrientation(std::span<const uint8_t> exif) {
  if (exif.size() >= 6 && std::memcmp(exif.data(), "Exif\0\0", 6) == 0) exif = exif.subspan(6);
  // Image.Exif.load: an 8-byte head that must be a TIFF header; BigTIFF heads fail there.
  if (exif.size() < 8 || !HasTiffPrefix(exif) || exif[2] == 0x2B) return {};
  const Reader r(exif, exif[0] == 'I');
  return ScanIfd(r, r.U(exif.data() + 4, 4), /*big=*/false);
}

OrientationTag ReadTiffOrientation(std::span<const uint8_t> tiff) {
  if (!HasTiffPrefix(tiff)) return {};
  const bool big = tiff[2] == 0x2B;
  if (tiff.size() < (big ? 16u : 8u)) return {};
  const Reader r(tiff, tiff[0] == 'I');
  return ScanIfd(r, big ? r.U(tiff.data() + 8, 8) : r.U(tiff.data() + 4, 4), big);
}

int ReadXmpOrientation(std::string_view xmp) {
  // re.search(r'tiff:Orientation(="|>)([0-9])', xmp)
  static constexpr std::string_view kKey = "tiff:Orientation";
  for (size_t pos = xmp.find(kKey); pos != std::string_view::npos; pos = xmp.find(kKey, pos + 1)) {
    size_t at = pos + kKey.size();
    if (at < xmp.size() && xmp[at] == '>') {
      at += 1;
    } else if (at + 1 < xmp.size() && xmp[at] == '=' && xmp[at + 1] == '"') {
      at += 2;
    } else {
      continue;
    }
    if (at < xmp.size() && xmp[at] >= '0' && xmp[at] <= '9') return xmp[at] - '0';
  }
  return 0;
}

}  // namespace iris::vision::detail
