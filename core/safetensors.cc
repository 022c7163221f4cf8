#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace iris::core {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit is 100 MB

absl::Status Invalid(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": invalid safetensors: ", std::string(what)));
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(const_cast<uint8_t*>(map_), map_size_);
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> file_bytes,
                                                         const std::string& path) {
  if (file_bytes.size() < 8) {
    return Invalid(path, absl::StrCat("file is ", file_bytes.size(), " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_bytes.data(), 8);  // little-endian on every host we build for
  if (header_len > kMaxHeaderBytes || header_len > file_bytes.size() - 8) {
    return Invalid(path, absl::StrCat("header length ", header_len, " exceeds the file (",
                                      file_bytes.size(), " bytes) or the 100 MB limit"));
  }
  SafetensorsHeader out;
  out.data_start = 8 + header_len;
  const size_t data_size = file_bytes.size() - out.data_start;
  const char* text = reinterpret_cast<const char*>(file_bytes.data()) + 8;
  nlohmann::json header = nlohmann::json::parse(text, text + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Invalid(path, "header is not a JSON object");
  }
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Invalid(path, "__metadata__ is not an object");
      for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
        if (!m2->is_string()) return Invalid(path, "__metadata__ values must be strings");
        out.metadata[m2.key()] = m2->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = *it;
    const std::string where = absl::StrCat("tensor \"", it.key(), "\"");
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      return Invalid(path, absl::StrCat(where, " needs dtype, shape and data_offsets"));
    }
    if (!e["dtype"].is_string()) return Invalid(path, absl::StrCat(where, ": dtype is not a string"));
    auto dtype = DTypeFromName(e["dtype"].get<std::string>());
    if (!dtype.ok()) return Invalid(path, absl::StrCat(where, ": ", dtype.status().message()));
    SafetensorsEntry entry;
    entry.name = it.key();
    entry.dtype = *dtype;
    if (!e["shape"].is_array()) return Invalid(path, absl::StrCat(where, ": shape is not an array"));
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) {
        return Invalid(path, absl::StrCat(where, ": shape entries must be non-negative integers"));
      }
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > (uint64_t{1} << 50) / v) {
        return Invalid(path, absl::StrCat(where, ": shape is too large"));
      }
      numel *= v;
      entry.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return Invalid(path, absl::StrCat(where, ": data_offsets must be [begin, end]"));
    }
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return Invalid(path, absl::StrCat(where, ": data_offsets [", begin, ", ", end,
                                        ") outside the data section of ", data_size, " bytes"));
    }
    if (end - begin != numel * DTypeSize(entry.dtype)) {
      return Invalid(path, absl::StrCat(where, ": ", end - begin, " bytes for ", numel, " ",
                                        DTypeName(entry.dtype), " elements"));
    }
    entry.begin = begin;
    entry.end = end;
    out.entries.push_back(std::move(entry));
  }
  // Tensors must not overlap.
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& e : out.entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](auto* a, auto* b) { return a->begin < b->begin || (a->begin == b->begin && a->end < b->end); });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->begin < sorted[i - 1]->end) {
      return Invalid(path, absl::StrCat("tensors \"", sorted[i - 1]->name, "\" and \"",
                                        sorted[i]->name, "\" overlap"));
    }
  }
  return out;
}

absl::StatusOr<std::shared_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": fstat failed"));
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_size_ = static_cast<size_t>(st.st_size);
  if (file->map_size_ < 8) {
    ::close(fd);
    return Invalid(path, absl::StrCat("file is ", file->map_size_, " bytes, shorter than the 8-byte header length"));
  }
  void* m = mmap(nullptr, file->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return absl::InternalError(absl::StrCat(path, ": mmap failed"));
  file->map_ = static_cast<const uint8_t*>(m);
  IRIS_ASSIGN_OR_RETURN(SafetensorsHeader header,
                        ParseSafetensorsHeader({file->map_, file->map_size_}, path));
  file->data_start_ = header.data_start;
  file->entries_ = std::move(header.entries);
  file->metadata_ = std::move(header.metadata);
  for (size_t i = 0; i < file->entries_.size(); ++i) {
    file->index_[file->entries_[i].name] = i;
  }
  file->weak_self_ = file;
  return file;
}

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  return &entries_[it->second];
}

absl::StatusOr<Tensor> SafetensorsFile::Get(std::string_view name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named \"", std::string(name), "\""));
  }
  const uint8_t* p = map_ + data_start_ + e->begin;
  if (reinterpret_cast<uintptr_t>(p) % DTypeSize(e->dtype) != 0) {
    Tensor t = Tensor::Empty(e->dtype, e->shape);
    std::memcpy(t.raw(), p, e->end - e->begin);
    return t;
  }
  std::shared_ptr<const SafetensorsFile> owner = weak_self_.lock();
  return Tensor::View(const_cast<uint8_t*>(p), e->dtype, e->shape, owner);
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") return absl::InvalidArgumentError("tensor name __metadata__ is reserved");
    header[name] = {{"dtype", std::string(DTypeName(t.dtype()))},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot write"));
    const uint64_t len = h.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, t] : tensors) {
      out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
    }
    if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": rename failed: ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  Checkpoint ckpt;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  nlohmann::json weight_map;
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": not a JSON object with a \"weight_map\" object"));
    }
    weight_map = index["weight_map"];
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": weight_map[\"",
                                                       it.key(), "\"] is not a file name"));
      }
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": shard name \"", shard, "\" must be a plain file name"));
      }
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end()) {
        shard_names.push_back(shard);
      }
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": neither model.safetensors nor model.safetensors.index.json is present"));
  }
  for (const std::string& shard : shard_names) {
    IRIS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((fs::path(dir) / shard).string()));
    const size_t idx = ckpt.files_.size();
    for (const auto& e : file->entries()) {
      if (!weight_map.is_null()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end() || it->get<std::string>() != shard) continue;
      }
      if (!ckpt.where_.emplace(e.name, idx).second) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor \"", e.name, "\" appears in more than one shard"));
      }
    }
    ckpt.files_.push_back(std::move(file));
  }
  if (!weight_map.is_null()) {
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!ckpt.where_.contains(it.key())) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor \"", it.key(),
                                                       "\" is listed but not in shard ",
                                                       it->get<std::string>()));
      }
    }
  }
  return ckpt;
}

bool Checkpoint::Has(std::string_view name) const { return where_.find(name) != where_.end(); }

absl::StatusOr<Tensor> Checkpoint::Get(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint has no tensor named \"", std::string(name), "\""));
  }
  return files_[it->second]->Get(name);
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, i] : where_) names.push_back(n);
  return names;
}

}  // namespace iris::core
