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

// rows: one pointer per output row (RGB rows, or for CMYK the destination RGB rows while
// `cmyk` holds kCmykBatch rows of 4-byte pixels).
bool Decompress(Decompressor* d, bool is_cmyk, JSAMPROW* rows, uint8_t* cmyk) {
  if (setjmp(d->err.jump)) return false;
  jpeg_decompress_struct* c = &d->cinfo;
  c->out_color_space = is_cmyk ? JCS_CMYK : JCS_EXT_RGB;
  c->dct_method = JDCT_ISLOW;        // Pillow's default (it switches only in draft mode)
  c->do_fancy_upsampling = TRUE;
  c->scale_num = c->scale_denom = 1;
  jpeg_start_decompress(c);
  if (c->output_width != c->image_width || c->output_height != c->image_height ||
      c->output_components != (is_cmyk ? 4 : 3)) {
    std::snprintf(d->err.message, sizeof d->err.message, "unexpected output format %ux%u x%d",
                  c->output_width, c->output_height, c->output_components);
    return false;
  }
  if (!is_cmyk) {
    while (c->output_scanline < c->output_height) {
      jpeg_read_scanlines(c, rows + c->output_scanline, c->output_height - c->output_scanline);
    }
  } else {
    JSAMPROW batch[kCmykBatch];
    const size_t stride = static_cast<size_t>(c->output_width) * 4;
    for (int i = 0; i < kCmykBatch; ++i) batch[i] = cmyk + i * stride;
    while (c->output_scanline < c->output_height) {
      const JDIMENSION first = c->output_scanline;
      const JDIMENSION n = jpeg_read_scanlines(c, batch, kCmykBatch);
      for (JDIMENSION i = 0; i < n; ++i) CmykRowToRgb(batch[i], rows[first + i], static_cast<int>(c->output_width));
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

  RgbImage image;
  std::vector<JSAMPROW> rows;
  std::vector<uint8_t> cmyk;
  try {
    image.width = static_cast<int>(c.image_width);
    image.height = static_cast<int>(c.image_height);
    image.pixels.resize(static_cast<size_t>(image.width) * image.height * 3);
    rows.resize(image.height);
    for (int y = 0; y < image.height; ++y) rows[y] = image.row(y);
    if (is_cmyk) cmyk.resize(static_cast<size_t>(image.width) * 4 * kCmykBatch);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for a ", image.width, "x", image.height, " JPEG"));
  }
  if (!Decompress(&d, is_cmyk, rows.data(), cmyk.data())) return LibjpegError(d);
  return image;
}

}  // namespace iris::vision::detail
