#include "vision/jpeg_decoder.h"

#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <cstring>
#include <new>
#include <vector>

#include <jpeglib.h>
#include <jerror.h>

#include "absl/strings/str_cat.h"
#include "vision/exif_orientation.h"
#include "vision/image_header.h"
#include "vision/image_transpose.h"

namespace iris::vision::detail {
namespace {

// libjpeg-turbo's TurboJPEG caps progressive scans at 500 to bound CPU time on hostile input;
// real encoders use about 10. Pillow has no cap.
constexpr int kMaxScans = 1000;

// libjpeg reports errors through error_exit, which by default calls exit(). Ours records the
// message and longjmps back into the phase function that called setjmp. Those phase functions
// (ReadHeader, Decompress) hold only trivially destructible locals, so nothing is skipped.
struct ErrorManager {
  jpeg_error_mgr pub;
  jpeg_progress_mgr progress;
  jmp_buf jump;
  bool truncated;
  char message[JMSG_LENGTH_MAX];
};

ErrorManager* Errors(j_common_ptr cinfo) { return reinterpret_cast<ErrorManager*>(cinfo->err); }

[[noreturn]] void OnError(j_common_ptr cinfo) {
  ErrorManager* err = Errors(cinfo);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

// Warnings (level -1) are ignored as Pillow ignores them, except running out of data: libjpeg
// would pad with a fake EOI and return grey, where Pillow says "image file is truncated".
void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) {
    ErrorManager* err = Errors(cinfo);
    err->truncated = true;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
  }
  cinfo->err->num_warnings++;
}

void OnProgress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxScans) {
    ErrorManager* err = Errors(cinfo);
    std::snprintf(err->message, sizeof err->message, "more than %d progressive scans", kMaxScans);
    longjmp(err->jump, 1);
  }
}

// Owns the decompressor; jpeg_destroy_decompress is safe on a zeroed or half-built struct.
struct Decompressor {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  Decompressor() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&err, 0, sizeof err);
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnError;
    err.pub.emit_message = OnMessage;
    err.progress.progress_monitor = OnProgress;
  }
  ~Decompressor() { jpeg_destroy_decompress(&cinfo); }
  Decompressor(const Decompressor&) = delete;
  Decompressor& operator=(const Decompressor&) = delete;
};

bool ReadHeader(Decompressor* d, const uint8_t* data, size_t size) {
  if (setjmp(d->err.jump)) return false;
  jpeg_create_decompress(&d->cinfo);
  d->cinfo.progress = &d->err.progress;
  jpeg_mem_src(&d->cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&d->cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&d->cinfo, TRUE);
  return true;
}

// Pillow: rawmode "CMYK;I" inverts the four channels, then Convert.c's cmyk2rgb.
inline uint8_t Muldiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

void CmykRowToRgb(const uint8_t* in, uint8_t* out, int width) {
  for (int x = 0; x < width; ++x, in += 4, out += 3) {
    const int nk = in[3];  // 255 - (255 - K)
    out[0] = static_cast<uint8_t>(nk - Muldiv255(255 - in[0], nk));
    out[1] = static_cast<uint8_t>(nk - Muldiv255(255 - in[1], nk));
    out[2] = static_cast<uint8_t>(nk - Muldiv255(255 - in[2], nk));
  }
}

constexpr int kCmykBatch = 16;
constexpr int kStrip = 32;  // rows decoded before a transposing scatter

struct Output {
  bool is_cmyk;
  JSAMPROW* rows;    // row mode: where each decoded row goes (nullptr in strip mode)
  uint8_t* strip;    // strip mode: kStrip RGB rows, scattered transposed into *image
  int orientation;   // strip mode: 5..8
  RgbImage* image;
  uint8_t* cmyk;     // CMYK: kCmykBatch rows of 4-byte pixels
};

// Reads up to `max_rows` rows into dst[0..], converting CMYK through o.cmyk; returns the count.
JDIMENSION ReadRows(jpeg_decompress_struct* c, const Output& o, JSAMPROW* dst, JDIMENSION max_rows) {
  if (!o.is_cmyk) return jpeg_read_scanlines(c, dst, max_rows);
  JSAMPROW batch[kCmykBatch];
  const size_t stride = static_cast<size_t>(c->output_width) * 4;
  for (int i = 0; i < kCmykBatch; ++i) batch[i] = o.cmyk + i * stride;
  const JDIMENSION n = jpeg_read_scanlines(c, batch, max_rows < kCmykBatch ? max_rows : kCmykBatch);
  for (JDIMENSION i = 0; i < n; ++i) CmykRowToRgb(batch[i], dst[i], static_cast<int>(c->output_width));
  return n;
}

bool Decompress(Decompressor* d, const Output& o) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct* c = &d->cinfo;
  c->out_color_space = o.is_cmyk ? JCS_CMYK : JCS_EXT_RGB;
  c->dct_method = JDCT_ISLOW;        // Pillow's default (it switches only in draft mode)
  c->do_fancy_upsampling = TRUE;
  c->scale_num = c->scale_denom = 1;
  jpeg_start_decompress(c);
  if (c->output_width != c->image_width || c->output_height != c->image_height ||
      c->output_components != (o.is_cmyk ? 4 : 3)) {
    std::snprintf(d->err.message, sizeof d->err.message, "unexpected output format %ux%u x%d",
                  c->output_width, c->output_height, c->output_components);
    return false;
  }
  const int width = static_cast<int>(c->output_width), height = static_cast<int>(c->output_height);
  if (o.strip == nullptr) {
    while (c->output_scanline < c->output_height) {
      ReadRows(c, o, o.rows + c->output_scanline, c->output_height - c->output_scanline);
    }
  } else {
    JSAMPROW strip_rows[kStrip];
    for (int i = 0; i < kStrip; ++i) strip_rows[i] = o.strip + static_cast<size_t>(i) * width * 3;
    while (c->output_scanline < c->output_height) {
      const int first = static_cast<int>(c->output_scanline);
      int n = 0;
      while (n < kStrip && c->output_scanline < c->output_height) {
        n += static_cast<int>(ReadRows(c, o, strip_rows + n, static_cast<JDIMENSION>(kStrip - n)));
      }
      ScatterTransposedRows(o.strip, static_cast<size_t>(width) * 3, first, n, width, height, o.orientation, o.image);
    }
  }
  jpeg_finish_decompress(c);  // reads up to EOI: a missing EOI is "truncated" for Pillow too
  return true;
}

absl::Status LibjpegError(const Decompressor& d) {
  if (d.err.truncated) {
    return absl::InvalidArgumentError(absl::StrCat("JPEG data is truncated (libjpeg: ", d.err.message, ")"));
  }
  return absl::InvalidArgumentError(absl::StrCat("invalid JPEG data (libjpeg: ", d.err.message, ")"));
}

}  // namespace

absl::StatusOr<RgbImage> DecodeJpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits,
                                    int* orientation) {
  *orientation = 1;
  Decompressor d;
  if (!ReadHeader(&d, bytes.data(), bytes.size())) return LibjpegError(d);
  const jpeg_decompress_struct& c = d.cinfo;
  if (absl::Status s = CheckDimensions(ImageFormat::kJpeg, c.image_width, c.image_height, limits); !s.ok()) {
    return s;
  }
  // Pillow maps the SOF component count to a mode: 1 -> L, 3 -> RGB, 4 -> CMYK, else it fails.
  const int components = c.num_components;
  if (components != 1 && components != 3 && components != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported JPEG: ", components, " colour components (1, 3 or 4 are supported)"));
  }
  const bool is_cmyk = components == 4;
  if (is_cmyk && c.jpeg_color_space != JCS_CMYK && c.jpeg_color_space != JCS_YCCK) {
    return absl::InvalidArgumentError("unsupported JPEG: 4 components that are neither CMYK nor YCCK");
  }
  // The first APP1 that starts with "Exif\0" is Pillow's info["exif"].
  for (jpeg_saved_marker_ptr m = c.marker_list; m != nullptr; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 5 && std::memcmp(m->data, "Exif\0", 5) == 0) {
      *orientation = ReadExifOrientation({m->data, m->data_length}).value;
      break;
    }
  }

  // Orientation is applied during the decode where that saves a pass: 4 by filling the rows
  // bottom-up, 5..8 by scattering strips of rows to their transposed place. 2 and 3 are left to
  // the caller (an in-place pass).
  const int oriented = *orientation;
  const bool strip_mode = SwapsAxes(oriented);
  RgbImage image;
  std::vector<JSAMPROW> rows;
  std::vector<uint8_t> strip, cmyk;
  const int width = static_cast<int>(c.image_width), height = static_cast<int>(c.image_height);
  try {
    image.width = strip_mode ? height : width;
    image.height = strip_mode ? width : height;
    image.pixels.resize(static_cast<size_t>(width) * height * 3);
    if (strip_mode) {
      strip.resize(static_cast<size_t>(width) * 3 * kStrip);
    } else {
      rows.resize(height);
      for (int y = 0; y < height; ++y) rows[y] = image.row(oriented == 4 ? height - 1 - y : y);
    }
    if (is_cmyk) cmyk.resize(static_cast<size_t>(width) * 4 * kCmykBatch);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory for a ", width, "x", height, " JPEG"));
  }
  const Output out{is_cmyk, strip_mode ? nullptr : rows.data(), strip_mode ? strip.data() : nullptr,
                   oriented, &image, cmyk.data()};
  if (!Decompress(&d, out)) return LibjpegError(d);
  if (strip_mode || oriented == 4) *orientation = 1;
  return image;
}

}  // namespace iris::vision::detail
