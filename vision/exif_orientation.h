// The orientation tag (0x0112) of an EXIF block or a TIFF file's first IFD, read exactly as
// Pillow 9.4's Image.getexif() reads it (so that exif_transpose decisions match the reference),
// and the XMP fallback Pillow uses for PNG.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace iris::vision::detail {

struct OrientationTag {
  bool present = false;  // IFD0 holds a usable 0x0112 entry (Pillow's `0x0112 in exif`)
  int value = 1;         // 2..8 where exif_transpose transposes; 1 otherwise
};

// `exif`: an EXIF payload as Pillow keeps it in info["exif"] (an optional "Exif\0\0" prefix,
// then a TIFF header and IFD0). Follows Pillow's parser: entries of unknown type or count 0
// are skipped, a later duplicate wins, the first entry whose data lies outside the block ends
// the scan (earlier entries are kept), and the first value of any numeric type counts (a
// RATIONAL 12/2 is 6; BYTE, UNDEFINED and ASCII values never match). Unreadable blocks (no TIFF
// header, BigTIFF, shorter than 8 bytes) give "not present"; Pillow raises on some of those.
OrientationTag ReadExifOrientation(std::span<const uint8_t> exif);

// The same for a whole TIFF file's IFD0 (BigTIFF included), as TiffImagePlugin reads it.
OrientationTag ReadTiffOrientation(std::span<const uint8_t> tiff);

// Pillow's XMP fallback: the digit of the first `tiff:Orientation="D` or `tiff:Orientation>D`,
// or 0 when there is none.
int ReadXmpOrientation(std::string_view xmp);

}  // namespace iris::vision::detail
