#!/usr/bin/python3
"""Writes the image-decoding fixtures in tests/data/decode/ and records, for each file, what the
reference's load_image does with it (Pillow 9.4: Image.open -> ImageOps.exif_transpose ->
convert("RGB")): the SHA-256 and shape of the decoded RGB, or the exception it raises.

Needs Debian's python3-pil (Pillow 9.4.0, libjpeg-turbo 2.1.5) and a C compiler with
libjpeg62-turbo-dev (for the YCCK / marker-less CMYK JPEGs Pillow cannot write). The test
(tests/image_decode_test.cc) only reads the files and expected.json; Python is needed only to
regenerate them:

    /usr/bin/python3 tools/scripts/make_decode_fixtures.py
"""

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

import PIL
from PIL import Image, ImageOps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "decode")

assert PIL.__version__ == "9.4.0", f"need Pillow 9.4.0 (the reference's), have {PIL.__version__}"


# ---------------------------------------------------------------------------------------------
# Deterministic content


class Lcg:
    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def next(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return self.s >> 33

    def byte(self):
        return self.next() & 0xFF


def rgb_pattern(w, h, seed=1):
    """Smooth gradients plus a little noise plus a few sharp features: JPEG-friendly but not flat."""
    rng = Lcg(seed)
    px = []
    for y in range(h):
        for x in range(w):
            r = (x * 255) // max(w - 1, 1)
            g = (y * 255) // max(h - 1, 1)
            b = ((x + y) * 7) & 0xFF
            if (x // 6 + y // 5) % 3 == 0:
                b = 255 - b
            n = rng.next() % 17 - 8
            px.append(tuple(max(0, min(255, v + n)) for v in (r, g, b)))
    im = Image.new("RGB", (w, h))
    im.putdata(px)
    # An asymmetric marker in the top-left corner, so every orientation is distinguishable.
    for y in range(min(4, h)):
        for x in range(min(8, w)):
            im.putpixel((x, y), (255, 0, 0))
    return im


# ---------------------------------------------------------------------------------------------
# The reference


def reference_load(path):
    """transformers.image_utils.load_image on a local file, as in the golden README."""
    image = Image.open(path)
    image = ImageOps.exif_transpose(image)
    image = image.convert("RGB")
    return image


def rgb_digest(image):
    assert image.mode == "RGB"
    data = image.tobytes()
    assert len(data) == image.size[0] * image.size[1] * 3
    return hashlib.sha256(data).hexdigest()


def pil_outcome(path):
    try:
        im = reference_load(path)
    except Exception as e:  # noqa: BLE001 - we record whatever the reference raises
        return {"ok": False, "error": f"{type(e).__name__}: {e}".replace(OUT + os.sep, "")}
    return {"ok": True, "shape_hwc": [im.size[1], im.size[0], 3], "sha256": rgb_digest(im)}


def pil_without_metadata(data):
    """Pillow's decode of the same file without the metadata it chokes on (what iris gives)."""
    im = Image.open(io.BytesIO(data)).convert("RGB")
    return {"ok": True, "shape_hwc": [im.size[1], im.size[0], 3], "sha256": rgb_digest(im)}


CASES = []


def record(name, desc, iris=None, **extra):
    """iris: None = must equal the reference; else a dict saying what iris does instead and why."""
    path = os.path.join(OUT, name)
    case = {"file": name, "desc": desc, "pil": pil_outcome(path)}
    if iris is not None:
        case["iris"] = iris
    case.update(extra)
    if iris is None and not case["pil"]["ok"]:
        case["iris"] = {"ok": False}
    CASES.append(case)


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------------------------------------
# JPEG helpers


def jpeg_bytes(im, **kw):
    buf = io.BytesIO()
    im.save(buf, "JPEG", **kw)
    return buf.getvalue()


def jpeg_segment(marker, payload):
    return struct.pack(">BBH", 0xFF, marker, len(payload) + 2) + payload


def jpeg_insert(data, segments, after_app0=True):
    """Inserts segments after SOI (and after a leading JFIF APP0 if after_app0)."""
    assert data[:2] == b"\xff\xd8"
    pos = 2
    if after_app0 and data[2:4] == b"\xff\xe0":
        pos = 4 + struct.unpack(">H", data[4:6])[0]
    return data[:pos] + b"".join(segments) + data[pos:]


def jpeg_strip_app0(data):
    assert data[2:4] == b"\xff\xe0"
    return data[:2] + data[4 + struct.unpack(">H", data[4:6])[0]:]


def tiff_ifd(endian, entries, next_ifd=0, ifd_offset=8, header=None, extra=b""):
    """A TIFF structure: header, IFD0 at ifd_offset with (tag, type, count, value_bytes4) entries."""
    e = "<" if endian == "II" else ">"
    if header is None:
        header = (b"II*\x00" if endian == "II" else b"MM\x00*") + struct.pack(e + "I", ifd_offset)
    body = bytearray(header)
    while len(body) < ifd_offset:
        body.append(0)
    body += struct.pack(e + "H", len(entries))
    for tag, typ, count, value in entries:
        if isinstance(value, int):
            size = {1: 1, 3: 2, 4: 4, 6: 1, 8: 2, 9: 4, 13: 4}[typ]
            fmt = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 13: "I"}[typ]
            value = struct.pack(e + fmt, value).ljust(4, b"\x00")
        assert len(value) == 4
        body += struct.pack(e + "HHI", tag, typ, count) + value
    body += struct.pack(e + "I", next_ifd)
    return bytes(body) + extra


def exif_orientation(endian, orientation):
    return tiff_ifd(endian, [(0x0112, 3, 1, orientation)])


def app1_exif(tiff, prefix=b"Exif\x00\x00"):
    return jpeg_segment(0xE1, prefix + tiff)


# ---------------------------------------------------------------------------------------------
# PNG helpers (written by hand: Pillow cannot write 16-bit RGB(A), 16-bit LA, tRNS on gray, ...)

ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png_chunk(typ, data):
    return struct.pack(">I", len(data)) + typ + data + struct.pack(">I", zlib.crc32(typ + data) & 0xFFFFFFFF)


def pack_row(pixels, bit_depth):
    """pixels: list of tuples of samples."""
    samples = [s for p in pixels for s in p]
    if bit_depth == 16:
        return b"".join(struct.pack(">H", s) for s in samples)
    if bit_depth == 8:
        return bytes(samples)
    out = bytearray()
    per = 8 // bit_depth
    for i in range(0, len(samples), per):
        byte = 0
        group = samples[i:i + per]
        for j, s in enumerate(group):
            byte |= s << (8 - bit_depth * (j + 1))
        out.append(byte)
    return bytes(out)


def filter_rows(rows, bpp, mode):
    """Applies PNG filter `mode` (0..4, or 'cycle') to packed rows."""
    out = bytearray()
    prev = bytes(len(rows[0])) if rows else b""
    for i, row in enumerate(rows):
        f = (i % 5) if mode == "cycle" else mode
        line = bytearray()
        for x in range(len(row)):
            a = row[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if (pa <= pb and pa <= pc) else (b if pb <= pc else c)
            line.append((row[x] - pred) & 0xFF)
        out.append(f)
        out += line
        prev = row
    return bytes(out)


def make_png(width, height, bit_depth, color_type, pixels, interlace=False, plte=None, trns=None,
             pre=(), post=(), filt="cycle", iend=True):
    """pixels: row-major list of sample tuples."""
    ch = CHANNELS[color_type]
    bpp = max(1, ch * bit_depth // 8)
    grid = [pixels[y * width:(y + 1) * width] for y in range(height)]
    raw = b""
    if not interlace:
        raw = filter_rows([pack_row(r, bit_depth) for r in grid], bpp, filt)
    else:
        for x0, y0, dx, dy in ADAM7:
            rows = [pack_row(grid[y][x0::dx], bit_depth) for y in range(y0, height, dy)]
            rows = [r for r in rows if r]
            if width > x0 and rows:
                raw += filter_rows(rows, bpp, filt)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 1 if interlace else 0)
    out = b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
    for c in pre:
        out += c
    if plte is not None:
        out += png_chunk(b"PLTE", bytes(v for p in plte for v in p))
    if trns is not None:
        out += png_chunk(b"tRNS", trns)
    comp = zlib.compress(raw, 9)
    # Two IDAT chunks, to exercise chunk boundaries inside the zlib stream.
    half = len(comp) // 2
    out += png_chunk(b"IDAT", comp[:half]) + png_chunk(b"IDAT", comp[half:])
    for c in post:
        out += c
    if iend:
        out += png_chunk(b"IEND", b"")
    return out


def rand_pixels(w, h, ch, maxval, seed):
    rng = Lcg(seed)
    return [tuple(rng.next() % (maxval + 1) for _ in range(ch)) for _ in range(w * h)]


def smooth16(w, h, ch, seed):
    rng = Lcg(seed)
    px = []
    for y in range(h):
        for x in range(w):
            base = [(x * 65535) // max(w - 1, 1), (y * 65535) // max(h - 1, 1), ((x + y) * 997) & 0xFFFF, (x * y * 131) & 0xFFFF]
            px.append(tuple((base[c] + rng.next() % 512) & 0xFFFF for c in range(ch)))
    return px


# ---------------------------------------------------------------------------------------------
# The C helper for JPEGs Pillow cannot write (YCCK, CMYK without an Adobe marker, restart
# intervals, arithmetic coding, 4:1:1 sampling, RGB stored without the YCbCr transform)

JPEG_WRITER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
int main(int argc, char** argv) {
  /* in.raw out.jpg width height components(3|4) colorspace(ycc|rgb|cmyk|ycck) adobe restart
     arith hsamp0 vsamp0 progressive */
  int w = atoi(argv[3]), h = atoi(argv[4]), n = atoi(argv[5]);
  const char* cs = argv[6];
  FILE* in = fopen(argv[1], "rb");
  unsigned char* buf = malloc((size_t)w * h * n);
  if (fread(buf, 1, (size_t)w * h * n, in) != (size_t)w * h * n) return 1;
  fclose(in);
  struct jpeg_compress_struct c; struct jpeg_error_mgr e;
  c.err = jpeg_std_error(&e);
  jpeg_create_compress(&c);
  FILE* out = fopen(argv[2], "wb");
  jpeg_stdio_dest(&c, out);
  c.image_width = w; c.image_height = h; c.input_components = n;
  c.in_color_space = n == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, !strcmp(cs, "ycck") ? JCS_YCCK : !strcmp(cs, "cmyk") ? JCS_CMYK :
                          !strcmp(cs, "rgb") ? JCS_RGB : JCS_YCbCr);
  c.write_Adobe_marker = atoi(argv[7]);
  c.restart_interval = atoi(argv[8]);
  c.arith_code = atoi(argv[9]);
  c.comp_info[0].h_samp_factor = atoi(argv[10]);
  c.comp_info[0].v_samp_factor = atoi(argv[11]);
  jpeg_set_quality(&c, 90, TRUE);
  if (atoi(argv[12])) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = buf + (size_t)c.next_scanline * w * n;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  fclose(out);
  jpeg_destroy_compress(&c);
  free(buf);
  return 0;
}
"""


def libjpeg_write(tmp, name, raw, w, h, n, colorspace, adobe=0, restart=0, arith=0, hsamp=1, vsamp=1,
                  progressive=0):
    exe = os.path.join(tmp, "jpeg_writer")
    if not os.path.exists(exe):
        src = os.path.join(tmp, "jpeg_writer.c")
        with open(src, "w") as f:
            f.write(JPEG_WRITER)
        subprocess.check_call(["cc", "-O1", "-o", exe, src, "-ljpeg"])
    path = os.path.join(tmp, "in.raw")
    with open(path, "wb") as f:
        f.write(raw)
    subprocess.check_call([exe, path, os.path.join(OUT, name), str(w), str(h), str(n), colorspace,
                           str(adobe), str(restart), str(arith), str(hsamp), str(vsamp), str(progressive)])


# ---------------------------------------------------------------------------------------------


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    tmp = tempfile.mkdtemp()

    base = rgb_pattern(48, 32, seed=7)

    # ---- JPEG: colour spaces and sampling
    write("jpeg_gray_45x31.jpg", jpeg_bytes(rgb_pattern(45, 31, 3).convert("L"), quality=90))
    record("jpeg_gray_45x31.jpg", "grayscale JPEG (1 component) -> R=G=B")
    write("jpeg_gray_progressive_40x24.jpg",
          jpeg_bytes(rgb_pattern(40, 24, 4).convert("L"), quality=85, progressive=True))
    record("jpeg_gray_progressive_40x24.jpg", "progressive grayscale JPEG")
    write("jpeg422_33x17.jpg", jpeg_bytes(rgb_pattern(33, 17, 5), quality=90, subsampling=1))
    record("jpeg422_33x17.jpg", "4:2:2, odd size (partial MCUs, fancy upsampling at the edges)")
    write("jpeg420_37x23.jpg", jpeg_bytes(rgb_pattern(37, 23, 6), quality=75, subsampling=2))
    record("jpeg420_37x23.jpg", "4:2:0, odd size")
    write("jpeg420_progressive_50x30.jpg",
          jpeg_bytes(rgb_pattern(50, 30, 8), quality=80, subsampling=2, progressive=True))
    record("jpeg420_progressive_50x30.jpg", "progressive 4:2:0, odd-ish size")
    cmyk = rgb_pattern(40, 30, 9).convert("CMYK")
    write("jpeg_cmyk_adobe_40x30.jpg", jpeg_bytes(cmyk, quality=90))
    record("jpeg_cmyk_adobe_40x30.jpg", "CMYK JPEG as Pillow writes it (Adobe APP14, inverted)")
    # Raw CMYK with varied K so that Pillow's cmyk2rgb rounding is exercised.
    rng = Lcg(11)
    raw = bytes(rng.byte() for _ in range(36 * 20 * 4))
    libjpeg_write(tmp, "jpeg_ycck_adobe_36x20.jpg", raw, 36, 20, 4, "ycck", adobe=1)
    record("jpeg_ycck_adobe_36x20.jpg", "YCCK JPEG (Adobe transform 2), libjpeg converts to CMYK")
    libjpeg_write(tmp, "jpeg_cmyk_noadobe_36x20.jpg", raw, 36, 20, 4, "cmyk", adobe=0)
    record("jpeg_cmyk_noadobe_36x20.jpg", "CMYK JPEG without an Adobe marker (Pillow still inverts)")
    libjpeg_write(tmp, "jpeg_ycck_progressive_36x20.jpg", raw, 36, 20, 4, "ycck", adobe=1, progressive=1)
    record("jpeg_ycck_progressive_36x20.jpg", "progressive YCCK JPEG")
    rgb_raw = rgb_pattern(45, 29, 15).tobytes()
    libjpeg_write(tmp, "jpeg_restart_45x29.jpg", rgb_raw, 45, 29, 3, "ycc", restart=1, hsamp=2, vsamp=2)
    record("jpeg_restart_45x29.jpg", "4:2:0 with a restart marker after every MCU row")
    libjpeg_write(tmp, "jpeg_arith_45x29.jpg", rgb_raw, 45, 29, 3, "ycc", arith=1, hsamp=2, vsamp=2)
    record("jpeg_arith_45x29.jpg", "arithmetic-coded 4:2:0")
    libjpeg_write(tmp, "jpeg411_45x29.jpg", rgb_raw, 45, 29, 3, "ycc", hsamp=4, vsamp=1)
    record("jpeg411_45x29.jpg", "4:1:1 sampling (h4v1)")
    libjpeg_write(tmp, "jpeg440_45x29.jpg", rgb_raw, 45, 29, 3, "ycc", hsamp=1, vsamp=2)
    record("jpeg440_45x29.jpg", "4:4:0 sampling (h1v2)")
    libjpeg_write(tmp, "jpeg_rgb_colorspace_45x29.jpg", rgb_raw, 45, 29, 3, "rgb", adobe=1)
    record("jpeg_rgb_colorspace_45x29.jpg", "RGB stored without the YCbCr transform (Adobe transform 0)")

    # ---- JPEG: EXIF orientation
    plain = jpeg_bytes(base, quality=90)
    for endian in ("II", "MM"):
        for o in range(1, 9):
            name = f"exif_{endian.lower()}_o{o}_48x32.jpg"
            write(name, jpeg_insert(plain, [app1_exif(exif_orientation(endian, o))]))
            record(name, f"EXIF orientation {o}, {'little' if endian == 'II' else 'big'}-endian")
    # Odd size with orientation 5..8 (transposes): partial MCUs, non-square.
    odd = jpeg_bytes(rgb_pattern(37, 23, 12), quality=90, subsampling=2)
    for o in (5, 7):
        name = f"exif_ii_o{o}_37x23.jpg"
        write(name, jpeg_insert(odd, [app1_exif(exif_orientation("II", o))]))
        record(name, f"EXIF orientation {o} on an odd-sized 4:2:0 image")

    def exif_case(name, desc, tiff, iris=None, segments=None, src=plain, prefix=b"Exif\x00\x00"):
        segs = segments if segments is not None else [app1_exif(tiff, prefix)]
        write(name, jpeg_insert(src, segs))
        if iris is not None and iris.get("as") == "no_exif":
            iris = dict(iris, **pil_without_metadata(src))
        record(name, desc, iris=iris)

    # Orientation stored with other types: Pillow takes the first value of whatever type.
    exif_case("exif_long_o6.jpg", "orientation as LONG", tiff_ifd("MM", [(0x0112, 4, 1, 6)]))
    exif_case("exif_sshort_o8.jpg", "orientation as SSHORT", tiff_ifd("II", [(0x0112, 8, 1, 8)]))
    exif_case("exif_byte_o6.jpg", "orientation as BYTE (Pillow yields bytes: no transpose)",
              tiff_ifd("II", [(0x0112, 1, 1, 6)]))
    exif_case("exif_ascii_o6.jpg", "orientation as ASCII '6' (a str: no transpose)",
              tiff_ifd("II", [(0x0112, 2, 2, b"6\x00\x00\x00")]))
    rational = tiff_ifd("II", [(0x0112, 5, 1, struct.pack("<I", 26))], extra=b"\x00\x00" + struct.pack("<II", 12, 2))
    exif_case("exif_rational_o6.jpg", "orientation as RATIONAL 12/2 (== 6 for Pillow)", rational)
    rational0 = tiff_ifd("II", [(0x0112, 5, 1, struct.pack("<I", 26))], extra=b"\x00\x00" + struct.pack("<II", 6, 0))
    exif_case("exif_rational_div0.jpg", "orientation as RATIONAL 6/0 (NaN: no transpose)", rational0)
    exif_case("exif_count2_o3.jpg", "orientation SHORT count 2 (3, 6): the first value counts",
              tiff_ifd("II", [(0x0112, 3, 2, struct.pack("<HH", 3, 6))]))
    exif_case("exif_count0.jpg", "orientation with count 0 (skipped)",
              tiff_ifd("II", [(0x0112, 3, 0, 6)]))
    exif_case("exif_dup_o3_o6.jpg", "two orientation entries: the later one wins",
              tiff_ifd("II", [(0x0112, 3, 1, 3), (0x0112, 3, 1, 6)]))
    exif_case("exif_unknown_type.jpg", "orientation with unknown type 14 (skipped), then 8",
              tiff_ifd("II", [(0x0112, 14, 1, b"\x06\x00\x00\x00"), (0x0112, 3, 1, 8)]))
    exif_case("exif_o9.jpg", "orientation 9 (invalid: no transpose)", exif_orientation("II", 9))
    exif_case("exif_o0.jpg", "orientation 0 (invalid: no transpose)", exif_orientation("MM", 0))
    exif_case("exif_badoffset_before.jpg",
              "a tag before orientation points its data past the end: Pillow stops reading the IFD",
              tiff_ifd("II", [(0x010F, 2, 20, struct.pack("<I", 5000)), (0x0112, 3, 1, 6)]))
    exif_case("exif_badoffset_after.jpg",
              "a tag after orientation points past the end: orientation already read",
              tiff_ifd("II", [(0x0112, 3, 1, 6), (0x0131, 2, 20, struct.pack("<I", 5000))]))
    trunc = tiff_ifd("II", [(0x0112, 3, 1, 6), (0x0131, 3, 1, 1), (0x0132, 3, 1, 1)])
    exif_case("exif_truncated_ifd.jpg", "IFD cut after the orientation entry", trunc[:8 + 2 + 12 + 5])
    exif_case("exif_ifd_offset_past_end.jpg", "IFD0 offset beyond the data (no tags)",
              tiff_ifd("II", [(0x0112, 3, 1, 6)], header=b"II*\x00" + struct.pack("<I", 4000)))
    exif_case("exif_ifd1_only.jpg", "orientation only in IFD1 (thumbnail): ignored",
              tiff_ifd("II", [(0x010F, 2, 4, b"abc\x00")], next_ifd=26,
                       extra=struct.pack("<H", 1) + struct.pack("<HHI", 0x0112, 3, 1) + struct.pack("<HH", 6, 0) + b"\x00" * 4))
    exif_case("exif_odd_ifd_offset.jpg", "IFD0 at an odd offset (legal for Pillow)",
              tiff_ifd("MM", [(0x0112, 3, 1, 8)], ifd_offset=11))
    exif_case("exif_mm_2a00.jpg", "header 'MM*\\0' (invalid, Pillow assumes big-endian)",
              tiff_ifd("MM", [(0x0112, 3, 1, 6)], header=b"MM*\x00" + struct.pack(">I", 8)))
    exif_case("exif_two_app1.jpg", "two Exif APP1 segments: the first counts", None,
              segments=[app1_exif(exif_orientation("II", 3)), app1_exif(exif_orientation("II", 6))])
    exif_case("exif_prefix_exif0x.jpg", "APP1 'Exif\\0X' (not Exif\\0\\0): Pillow finds no TIFF header",
              exif_orientation("II", 6), prefix=b"Exif\x00X")
    exif_case("exif_garbage.jpg", "garbage after Exif\\0\\0, no JFIF dpi: Pillow ignores it",
              b"this is not a TIFF header at all")
    exif_case("exif_empty.jpg", "Exif\\0\\0 and nothing else", b"")
    # Garbage EXIF where Pillow raises: iris ignores the EXIF instead (documented difference).
    dpi_plain = jpeg_bytes(base, quality=90, dpi=(72, 72))
    exif_case("exif_garbage_jfif_dpi.jpg",
              "garbage EXIF after a JFIF APP0 with dpi units: Pillow raises in exif_transpose",
              b"this is not a TIFF header at all", src=dpi_plain,
              iris={"ok": True, "as": "no_exif", "why": "iris ignores unreadable EXIF rather than rejecting the image"})
    exif_case("exif_short_header.jpg",
              "a 6-byte TIFF header: Pillow raises struct.error while opening",
              b"II*\x00\x08\x00",
              iris={"ok": True, "as": "no_exif", "why": "iris ignores unreadable EXIF rather than rejecting the image"})
    # Orientation on a progressive CMYK: transposes compose with colour conversion.
    write("exif_o6_cmyk.jpg", jpeg_insert(jpeg_bytes(rgb_pattern(30, 20, 13).convert("CMYK"), quality=90),
                                          [app1_exif(exif_orientation("II", 6))], after_app0=False))
    record("exif_o6_cmyk.jpg", "CMYK JPEG with EXIF orientation 6")

    # ---- JPEG: broken
    big = open(os.path.join(ROOT, "tests", "data", "images", "jpeg420_q90_1000x667.jpg"), "rb").read()
    small = jpeg_bytes(rgb_pattern(64, 48, 14), quality=90)
    write("jpeg_truncated_half.jpg", small[: len(small) // 2])
    record("jpeg_truncated_half.jpg", "JPEG cut in half")
    assert small.endswith(b"\xff\xd9")
    write("jpeg_no_eoi.jpg", small[:-2])
    record("jpeg_no_eoi.jpg", "JPEG complete but for the EOI marker (Pillow: truncated)")
    write("jpeg_trailing_garbage.jpg", small + b"trailing bytes after EOI")
    record("jpeg_trailing_garbage.jpg", "JPEG followed by junk after EOI (fine for both)")
    sof = small.find(b"\xff\xc0")
    huge = bytearray(small)
    struct.pack_into(">HH", huge, sof + 5, 60000, 60000)
    write("jpeg_huge_header.jpg", bytes(huge))
    record("jpeg_huge_header.jpg", "SOF declares 60000x60000 (3.6e9 pixels)",
           iris={"ok": False, "why": "over DecodeLimits.max_pixels"})
    corrupt = bytearray(small)
    sos = corrupt.find(b"\xff\xda")
    for i in range(sos + 20, len(corrupt) - 2, 7):
        corrupt[i] = 0xFF if corrupt[i] != 0xFF else 0x00
    write("jpeg_corrupt_scan.jpg", bytes(corrupt))
    record("jpeg_corrupt_scan.jpg", "entropy-coded data overwritten with 0xFF bytes (markers)")
    del big

    # ---- PNG
    W, H = 19, 13
    # 16-bit RGB / RGBA (Pillow: high byte), 16-bit gray+alpha (Pillow: RGBA from high bytes).
    write("png_rgb16_19x13.png", make_png(W, H, 16, 2, smooth16(W, H, 3, 21)))
    record("png_rgb16_19x13.png", "16-bit RGB (Pillow keeps the high byte)")
    write("png_rgba16_19x13.png", make_png(W, H, 16, 6, smooth16(W, H, 4, 22)))
    record("png_rgba16_19x13.png", "16-bit RGBA (alpha dropped, high byte)")
    write("png_la16_19x13.png", make_png(W, H, 16, 4, smooth16(W, H, 2, 23)))
    record("png_la16_19x13.png", "16-bit gray+alpha (Pillow mode RGBA from the high bytes)")
    write("png_gray16_19x13.png", make_png(W, H, 16, 0, [(v % 600,) for (v,) in smooth16(W, H, 1, 24)]))
    record("png_gray16_19x13.png", "16-bit gray with values 0..599 (clipped at 255, not scaled)")
    write("png_gray16_interlaced_19x13.png",
          make_png(W, H, 16, 0, [(v % 600,) for (v,) in smooth16(W, H, 1, 25)], interlace=True))
    record("png_gray16_interlaced_19x13.png", "interlaced 16-bit gray (clipped)")
    write("png_gray16_trns_19x13.png",
          make_png(W, H, 16, 0, [(v % 300,) for (v,) in smooth16(W, H, 1, 26)], trns=struct.pack(">H", 7)))
    record("png_gray16_trns_19x13.png", "16-bit gray with tRNS (ignored)")
    # 8-bit and low-bit gray.
    write("png_la8_19x13.png", make_png(W, H, 8, 4, rand_pixels(W, H, 2, 255, 27)))
    record("png_la8_19x13.png", "8-bit gray+alpha (alpha dropped, never composited)")
    write("png_gray8_trns_19x13.png", make_png(W, H, 8, 0, rand_pixels(W, H, 1, 255, 28), trns=struct.pack(">H", 40)))
    record("png_gray8_trns_19x13.png", "8-bit gray with tRNS (ignored)")
    for bits in (1, 2, 4):
        name = f"png_gray{bits}_19x13.png"
        write(name, make_png(W, H, bits, 0, rand_pixels(W, H, 1, (1 << bits) - 1, 29 + bits)))
        record(name, f"{bits}-bit gray (scaled to 0..255 by bit replication)")
    write("png_gray2_interlaced_19x13.png", make_png(W, H, 2, 0, rand_pixels(W, H, 1, 3, 33), interlace=True))
    record("png_gray2_interlaced_19x13.png", "interlaced 2-bit gray")
    # Truecolour.
    write("png_rgb8_trns_19x13.png",
          make_png(W, H, 8, 2, rand_pixels(W, H, 3, 255, 34), trns=struct.pack(">HHH", 1, 2, 3)))
    record("png_rgb8_trns_19x13.png", "8-bit RGB with tRNS (ignored)")
    write("png_rgb16_trns_19x13.png",
          make_png(W, H, 16, 2, smooth16(W, H, 3, 35), trns=struct.pack(">HHH", 1000, 2000, 3000)))
    record("png_rgb16_trns_19x13.png", "16-bit RGB with tRNS (ignored)")
    write("png_rgba8_transparent_19x13.png",
          make_png(W, H, 8, 6, [(r, g, b, 0 if (r & 1) else a) for (r, g, b, a) in rand_pixels(W, H, 4, 255, 36)]))
    record("png_rgba8_transparent_19x13.png", "RGBA with fully transparent pixels: stored colour kept")
    for ct, bits, ch in ((2, 8, 3), (6, 8, 4), (6, 16, 4), (4, 8, 2)):
        name = f"png_ct{ct}_{bits}bit_interlaced_19x13.png"
        px = rand_pixels(W, H, ch, (1 << bits) - 1, 40 + ct + bits)
        write(name, make_png(W, H, bits, ct, px, interlace=True))
        record(name, f"interlaced colour type {ct}, {bits}-bit")
    for w, h in ((1, 1), (1, 9), (9, 1), (2, 2), (5, 3)):
        name = f"png_interlaced_rgb_{w}x{h}.png"
        write(name, make_png(w, h, 8, 2, rand_pixels(w, h, 3, 255, 50 + w * 10 + h), interlace=True))
        record(name, f"interlaced RGB {w}x{h} (empty Adam7 passes)")
    # Palette.
    pal = [(i * 37 % 256, i * 91 % 256, i * 53 % 256) for i in range(16)]
    write("png_palette8_trns_19x13.png",
          make_png(W, H, 8, 3, rand_pixels(W, H, 1, 15, 60), plte=pal, trns=bytes([0, 128, 255, 7])))
    record("png_palette8_trns_19x13.png", "8-bit palette with a per-entry tRNS (ignored)")
    write("png_palette8_trns1_19x13.png",
          make_png(W, H, 8, 3, rand_pixels(W, H, 1, 15, 61), plte=pal, trns=bytes([255, 255, 0])))
    record("png_palette8_trns1_19x13.png", "8-bit palette with a single transparent entry (ignored)")
    for bits in (1, 2, 4):
        n = 1 << bits
        name = f"png_palette{bits}_19x13.png"
        write(name, make_png(W, H, bits, 3, rand_pixels(W, H, 1, n - 1, 62 + bits), plte=pal[:n]))
        record(name, f"{bits}-bit palette")
    write("png_palette4_interlaced_19x13.png",
          make_png(W, H, 4, 3, rand_pixels(W, H, 1, 15, 67), plte=pal, interlace=True))
    record("png_palette4_interlaced_19x13.png", "interlaced 4-bit palette")
    write("png_palette_short_19x13.png",
          make_png(W, H, 8, 3, rand_pixels(W, H, 1, 255, 68), plte=pal[:5]))
    record("png_palette_short_19x13.png", "5-entry PLTE with indices up to 255 (out of range)")
    # Filters: all five in every image above ('cycle'); one more with Paeth only on 16-bit.
    write("png_rgb16_paeth_19x13.png", make_png(W, H, 16, 2, smooth16(W, H, 3, 70), filt=4))
    record("png_rgb16_paeth_19x13.png", "16-bit RGB, Paeth filter on every row")
    # Pillow-written PNGs (its own filter choices).
    for mode in ("RGB", "RGBA", "L", "LA", "P", "1", "I;16"):
        im = rgb_pattern(W, H, 71)
        if mode == "I;16":
            im = im.convert("L").point(lambda v: v * 3).convert("I").point(lambda v: v * 1)
            im = im.convert("I;16")
        elif mode == "P":
            im = im.convert("P", palette=Image.Palette.ADAPTIVE, colors=50)
        else:
            im = im.convert(mode)
        name = f"png_pillow_{mode.replace(';', '')}_19x13.png"
        im.save(os.path.join(OUT, name))
        record(name, f"written by Pillow from mode {mode}")
    # EXIF in PNG.
    rgbpx = [tuple(p) for p in rgb_pattern(W, H, 72).getdata()]
    exif6 = exif_orientation("II", 6)
    write("png_exif_o6_pre_idat.png", make_png(W, H, 8, 2, rgbpx, pre=[png_chunk(b"eXIf", exif6)]))
    record("png_exif_o6_pre_idat.png", "eXIf chunk (orientation 6) before IDAT")
    write("png_exif_o8_post_idat.png",
          make_png(W, H, 8, 2, rgbpx, post=[png_chunk(b"eXIf", exif_orientation("MM", 8))]))
    record("png_exif_o8_post_idat.png", "eXIf chunk (orientation 8, big-endian) after IDAT")
    raw_profile = "\nexif\n%8d\n" % (len(exif6) + 6) + (b"Exif\x00\x00" + exif6).hex() + "\n"
    ztxt = b"Raw profile type exif\x00\x00" + zlib.compress(raw_profile.encode("latin-1"))
    write("png_rawprofile_o6.png", make_png(W, H, 8, 2, rgbpx, pre=[png_chunk(b"zTXt", ztxt)]))
    record("png_rawprofile_o6.png", "ImageMagick-style 'Raw profile type exif' zTXt (orientation 6)")
    xmp = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description '
           'tiff:Orientation="8"/></rdf:RDF></x:xmpmeta>').encode()
    itxt = b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + xmp
    write("png_xmp_o8.png", make_png(W, H, 8, 2, rgbpx, pre=[png_chunk(b"iTXt", itxt)]))
    record("png_xmp_o8.png", "XMP iTXt with tiff:Orientation=\"8\" and no EXIF")
    write("png_xmp_elem_o3.png", make_png(W, H, 8, 2, rgbpx, post=[png_chunk(
        b"iTXt", b"XML:com.adobe.xmp\x00\x01\x00\x00\x00" + zlib.compress(
            b"<x:xmpmeta><tiff:Orientation>3</tiff:Orientation></x:xmpmeta>"))]))
    record("png_xmp_elem_o3.png", "compressed XMP iTXt after IDAT, <tiff:Orientation>3<...")
    write("png_exif_and_xmp.png", make_png(W, H, 8, 2, rgbpx, pre=[
        png_chunk(b"eXIf", exif_orientation("II", 1)), png_chunk(b"iTXt", itxt)]))
    record("png_exif_and_xmp.png", "eXIf says 1, XMP says 8: EXIF wins (XMP only without the tag)")
    write("png_gamma_chunks_19x13.png", make_png(W, H, 8, 2, rgbpx, pre=[
        png_chunk(b"gAMA", struct.pack(">I", 45455)), png_chunk(b"sRGB", b"\x00"),
        png_chunk(b"cHRM", struct.pack(">8I", 31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000)),
        png_chunk(b"pHYs", struct.pack(">IIB", 2835, 2835, 1)), png_chunk(b"tEXt", b"Comment\x00hello")]))
    record("png_gamma_chunks_19x13.png", "gAMA/sRGB/cHRM/pHYs/tEXt chunks: no colour management in either")
    # PNG: broken and limits.
    good = make_png(W, H, 8, 2, rgbpx)
    write("png_no_iend.png", good[:-12])
    record("png_no_iend.png", "PNG without IEND (Pillow decodes it)")
    write("png_trailing_garbage.png", good + b"junk after IEND")
    record("png_trailing_garbage.png", "PNG with junk after IEND")
    idat = good.find(b"IDAT")
    write("png_truncated_idat.png", good[: idat + 30])
    record("png_truncated_idat.png", "PNG cut inside the IDAT data")
    bad_ihdr = bytearray(good)
    bad_ihdr[8 + 8 + 13] ^= 0x55  # first CRC byte of IHDR
    write("png_bad_ihdr_crc.png", bytes(bad_ihdr))
    record("png_bad_ihdr_crc.png", "IHDR CRC wrong")
    bad_idat_crc = bytearray(good)
    first_idat_len = struct.unpack(">I", good[idat - 4: idat])[0]
    bad_idat_crc[idat + 4 + first_idat_len] ^= 0x55
    write("png_bad_idat_crc.png", bytes(bad_idat_crc))
    record("png_bad_idat_crc.png", "first IDAT's CRC wrong (Pillow does not check IDAT CRCs)")
    bad_idat = bytearray(good)
    for i in range(idat + 10, idat + 4 + first_idat_len, 3):
        bad_idat[i] ^= 0xA5
    write("png_corrupt_idat.png", bytes(bad_idat))
    record("png_corrupt_idat.png", "IDAT data scrambled (zlib error)")
    write("png_huge_header.png", b"\x89PNG\r\n\x1a\n" + png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)) + png_chunk(b"IEND", b""))
    record("png_huge_header.png", "IHDR declares 100000x100000, no image data",
           iris={"ok": False, "why": "over DecodeLimits.max_pixels"})

    # ---- WebP (decoded by OpenCV in iris)
    webp_src = rgb_pattern(41, 27, 80)
    webp_src.save(os.path.join(OUT, "webp_lossy_41x27.webp"), "WEBP", quality=80)
    record("webp_lossy_41x27.webp", "lossy WebP (VP8)")
    rgba = webp_src.convert("RGBA")
    rng = Lcg(81)
    rgba.putalpha(Image.frombytes("L", rgba.size, bytes(rng.byte() for _ in range(41 * 27))))
    rgba.save(os.path.join(OUT, "webp_lossless_alpha_41x27.webp"), "WEBP", lossless=True, exact=True)
    record("webp_lossless_alpha_41x27.webp", "lossless WebP (VP8L) with varied alpha (dropped)")
    rgba.save(os.path.join(OUT, "webp_lossy_alpha_41x27.webp"), "WEBP", quality=80)
    record("webp_lossy_alpha_41x27.webp", "lossy WebP with an ALPH chunk (VP8X)")
    ex = Image.Exif()
    ex[0x0112] = 6
    webp_src.save(os.path.join(OUT, "webp_exif_o6_41x27.webp"), "WEBP", quality=80, exif=ex)
    record("webp_exif_o6_41x27.webp", "lossy WebP with an EXIF chunk, orientation 6")

    webp_src.save(os.path.join(OUT, "webp_lossless_41x27.webp"), "WEBP", lossless=True)
    record("webp_lossless_41x27.webp", "lossless WebP without alpha")
    webp_src.save(os.path.join(OUT, "webp_animated_41x27.webp"), "WEBP", save_all=True, duration=100,
                  append_images=[webp_src.transpose(Image.Transpose.FLIP_LEFT_RIGHT)])
    record("webp_animated_41x27.webp", "animated WebP (2 frames): Pillow gives the first frame",
           iris={"ok": False, "why": "OpenCV 4.6 cannot decode animated WebP; iris rejects it"})

    # ---- BMP
    bmp_src = rgb_pattern(23, 11, 90)
    bmp_src.save(os.path.join(OUT, "bmp_rgb24_23x11.bmp"))
    record("bmp_rgb24_23x11.bmp", "24-bit BMP, bottom-up, rows padded")
    bmp_src.convert("P", palette=Image.Palette.ADAPTIVE, colors=20).save(os.path.join(OUT, "bmp_pal8_23x11.bmp"))
    record("bmp_pal8_23x11.bmp", "8-bit palette BMP")
    bmp_src.convert("L").save(os.path.join(OUT, "bmp_gray8_23x11.bmp"))
    record("bmp_gray8_23x11.bmp", "8-bit grayscale BMP (a gray palette)")
    bmp_src.convert("1").save(os.path.join(OUT, "bmp_1bit_23x11.bmp"))
    record("bmp_1bit_23x11.bmp", "1-bit BMP")
    bmp_rgba = bmp_src.convert("RGBA")
    bmp_rgba.putalpha(Image.linear_gradient("L").resize((23, 11)))
    bmp_rgba.save(os.path.join(OUT, "bmp_rgba32_23x11.bmp"))
    record("bmp_rgba32_23x11.bmp", "32-bit BMP with alpha (dropped)")
    # Hand-made top-down 24-bit BMP (negative height).
    w, h = 23, 11
    stride = (w * 3 + 3) & ~3
    pix = b"".join(bytes(v for p in [bmp_src.getpixel((x, y))[::-1] for x in range(w)] for v in p).ljust(stride, b"\x00")
                   for y in range(h))
    dib = struct.pack("<IiiHHIIiiII", 40, w, -h, 1, 24, 0, len(pix), 2835, 2835, 0, 0)
    write("bmp_topdown_23x11.bmp", b"BM" + struct.pack("<IHHI", 14 + 40 + len(pix), 0, 0, 54) + dib + pix)
    record("bmp_topdown_23x11.bmp", "24-bit top-down BMP (negative height)")
    write("bmp_huge_header.bmp", b"BM" + struct.pack("<IHHI", 54, 0, 0, 54) +
          struct.pack("<IiiHHIIiiII", 40, 50000, 50000, 1, 24, 0, 0, 0, 0, 0, 0))
    record("bmp_huge_header.bmp", "BMP header declares 50000x50000",
           iris={"ok": False, "why": "over DecodeLimits.max_pixels"})

    # ---- TIFF
    tif_src = rgb_pattern(21, 14, 100)
    tif_src.save(os.path.join(OUT, "tiff_rgb_raw_21x14.tif"))
    record("tiff_rgb_raw_21x14.tif", "uncompressed RGB TIFF")
    tif_src.save(os.path.join(OUT, "tiff_rgb_lzw_21x14.tif"), compression="tiff_lzw")
    record("tiff_rgb_lzw_21x14.tif", "LZW RGB TIFF")
    tif_src.convert("L").save(os.path.join(OUT, "tiff_gray_deflate_21x14.tif"), compression="tiff_adobe_deflate")
    record("tiff_gray_deflate_21x14.tif", "deflate grayscale TIFF")
    # Pillow 9.4 applies a TIFF's Orientation twice in load_image (once in TiffImageFile.load_end,
    # once in exif_transpose): 6 and 8 come out rotated 180 degrees, 2/3/4/5/7 unchanged.
    for o, comp in ((6, None), (8, "tiff_lzw"), (2, None), (5, "tiff_lzw"), (3, None), (4, None), (7, "tiff_lzw")):
        name = f"tiff_rgb_o{o}_21x14.tif"
        kw = {"compression": comp} if comp else {}
        tif_src.save(os.path.join(OUT, name), tiffinfo={274: o}, **kw)
        record(name, f"RGB TIFF with Orientation {o} in IFD0 ({comp or 'raw'}); Pillow applies it twice")
    # Other TIFF flavours OpenCV reads the way Pillow does.
    tif_modes = rgb_pattern(21, 14, 200)
    tif_modes.convert("P", palette=Image.Palette.ADAPTIVE, colors=30).save(os.path.join(OUT, "tiff_palette_21x14.tif"))
    record("tiff_palette_21x14.tif", "palette TIFF")
    tif_modes.convert("CMYK").save(os.path.join(OUT, "tiff_cmyk_21x14.tif"))
    record("tiff_cmyk_21x14.tif", "CMYK TIFF (libtiff's and Pillow's CMYK->RGB agree)")
    tif_modes.convert("1").save(os.path.join(OUT, "tiff_bilevel_21x14.tif"))
    record("tiff_bilevel_21x14.tif", "1-bit TIFF")
    tif_modes.save(os.path.join(OUT, "tiff_jpeg_21x14.tif"), compression="jpeg")
    record("tiff_jpeg_21x14.tif", "JPEG-compressed TIFF")
    tif_modes.save(os.path.join(OUT, "tiff_packbits_21x14.tif"), compression="packbits")
    record("tiff_packbits_21x14.tif", "PackBits TIFF")
    gray16 = Image.frombytes("I;16", (21, 14), b"".join(struct.pack("<H", (i * 37) % 700) for i in range(21 * 14)))
    gray16.save(os.path.join(OUT, "tiff_gray16_21x14.tif"))
    record("tiff_gray16_21x14.tif", "16-bit gray TIFF with values up to 699 (Pillow clips at 255)")
    gray16.save(os.path.join(OUT, "tiff_gray16_o6_21x14.tif"), tiffinfo={274: 6})
    record("tiff_gray16_o6_21x14.tif", "16-bit gray TIFF, Orientation 6 (applied twice by Pillow)")
    rgba_t = tif_modes.convert("RGBA")
    rgba_t.putalpha(Image.linear_gradient("L").resize((21, 14)))
    rgba_t.save(os.path.join(OUT, "tiff_rgba_21x14.tif"))
    record("tiff_rgba_21x14.tif", "RGBA TIFF (unassociated alpha)",
           iris={"ok": True, "shape_hwc": [14, 21, 3], "sha256": None,
                 "why": "OpenCV reads 8-bit RGBA TIFFs through libtiff's TIFFReadRGBA*, which "
                        "premultiplies unassociated alpha; Pillow just drops alpha"})
    big_tif = tiff_ifd("II", [(256, 4, 1, 70000), (257, 4, 1, 70000), (258, 3, 1, 8), (259, 3, 1, 1),
                              (262, 3, 1, 1), (273, 4, 1, 8), (277, 3, 1, 1), (278, 4, 1, 70000),
                              (279, 4, 1, 70000 * 70000 & 0xFFFFFFFF)])
    write("tiff_huge_header.tif", big_tif)
    record("tiff_huge_header.tif", "TIFF IFD declares 70000x70000",
           iris={"ok": False, "why": "over DecodeLimits.max_pixels"})

    # ---- Not images / unsupported
    Image.new("RGB", (8, 8), (1, 2, 3)).save(os.path.join(OUT, "gif_8x8.gif"))
    record("gif_8x8.gif", "GIF: Pillow opens it, iris does not support it",
           iris={"ok": False, "why": "unsupported format"})
    write("garbage.bin", bytes(Lcg(110).byte() for _ in range(300)))
    record("garbage.bin", "300 random bytes")

    manifest = {
        "description": "Image-decoding fixtures. 'pil' is what the reference's load_image (Pillow "
                       "9.4.0: Image.open -> ImageOps.exif_transpose -> convert('RGB')) gives: the "
                       "SHA-256 of the HxWx3 uint8 buffer, or the exception. 'iris' (only where it "
                       "differs from 'pil') is what iris is expected to do instead.",
        "generator": "tools/scripts/make_decode_fixtures.py",
        "pillow": PIL.__version__,
        "cases": CASES,
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"{len(CASES)} cases, {total} bytes in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
