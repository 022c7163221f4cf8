/* An empty ICU data library for the GPU bundle (scripts/gpu_bundle.sh): libicuuc needs a
 * libicudata that exports icudt<N>_dat, and iris uses only what libicuuc carries compiled in
 * (NFC normalization, binary character properties), so an empty table of contents stands in for
 * the 31 MB data file. Built with -DICU_DATA_SYMBOL=icudt<N>_dat. Layout: the 4-byte MappedData
 * header (header size, magic 0xda 0x27), the 20-byte UDataInfo ("ToCP" format 1, little-endian,
 * ASCII, 2-byte UChar), 8 bytes of padding, then a table of contents of zero entries. */
#include <stdint.h>

struct StubData {
  uint16_t header_size;
  uint8_t magic1, magic2;
  uint16_t info_size, info_reserved;
  uint8_t is_big_endian, charset_family, sizeof_uchar, info_reserved_byte;
  uint8_t data_format[4], format_version[4], data_version[4];
  uint8_t padding[8];
  uint32_t count, reserved;
};

__attribute__((visibility("default"))) const struct StubData ICU_DATA_SYMBOL = {
    32, 0xda, 0x27, 20, 0, 0, 0, 2, 0, {'T', 'o', 'C', 'P'}, {1, 0, 0, 0}, {0, 0, 0, 0}, {0}, 0, 0};
