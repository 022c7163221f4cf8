// safetensors files: a validating, zero-copy (mmap) reader, a writer, and Checkpoint, which
// opens a Hugging Face model folder (one file or shards listed in model.safetensors.index.json).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace iris::core {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  size_t begin = 0;  // byte offsets inside the data section
  size_t end = 0;
};

// A validated header: length, JSON, dtypes, shapes, offsets against the data section, and that
// tensors do not overlap. `file_bytes` is the whole file; `path` names it in errors.
struct SafetensorsHeader {
  size_t data_start = 0;  // offset of the data section in the file
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> file_bytes,
                                                         const std::string& path);

class SafetensorsFile {
 public:
  // Maps the file and validates its header (ParseSafetensorsHeader).
  static absl::StatusOr<std::shared_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A zero-copy view that keeps the mapping alive. If the bytes are not aligned for the dtype,
  // the tensor is copied instead.
  absl::StatusOr<Tensor> Get(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  size_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> weak_self_;
};

// Writes tensors in the order given; the header is padded with spaces to 8 bytes.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The weights of a model folder. Opens `model.safetensors`, or every shard named in
// `model.safetensors.index.json` (checking that each listed tensor is in its shard).
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::string& dir);
  bool Has(std::string_view name) const;
  absl::StatusOr<Tensor> Get(std::string_view name) const;
  std::vector<std::string> Names() const;

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t, std::less<>> where_;  // tensor name -> index into files_
};

}  // namespace iris::core
