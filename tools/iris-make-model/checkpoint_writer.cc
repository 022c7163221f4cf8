#include "tools/iris-make-model/checkpoint_writer.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <memory>
#include <regex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/iris-make-model/synthetic_weights.h"

namespace iris::tools {
namespace {

namespace fs = std::filesystem;

// Elements generated per buffer; two buffers alternate so that writing one overlaps
// generating the next.
constexpr int64_t kChunkElements = int64_t{4} << 20;  // 8 MB of bf16

int64_t Numel(const TensorSpec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape) n *= d;
  return n;
}

// A file written under a temporary name and renamed into place on Commit().
class OutputFile {
 public:
  OutputFile() = default;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }

  absl::Status Open(const std::string& path) {
    path_ = path;
    tmp_ = path + ".tmp";
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", tmp_, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  absl::Status Write(const void* data, size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::DataLossError(absl::StrCat("write to ", tmp_, " failed: ", std::strerror(errno)));
      }
      p += n;
      size -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Commit() {
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) {
      ::unlink(tmp_.c_str());
      return absl::DataLossError(absl::StrCat("closing ", tmp_, " failed: ", std::strerror(errno)));
    }
    std::error_code ec;
    fs::rename(tmp_, path_, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp_, " to ", path_, ": ", ec.message()));
    return absl::OkStatus();
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  OutputFile f;
  IRIS_RETURN_IF_ERROR(f.Open(path));
  IRIS_RETURN_IF_ERROR(f.Write(text.data(), text.size()));
  return f.Commit();
}

// Generates `specs` (already in file order) into one safetensors file, streaming through two
// alternating buffers.
absl::Status WriteShard(const std::string& path, uint64_t seed, const std::vector<TensorSpec>& specs) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorSpec& s : specs) {
    const uint64_t bytes = static_cast<uint64_t>(Numel(s)) * 2;
    header[s.name] = {{"dtype", "BF16"}, {"shape", s.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');

  OutputFile out;
  IRIS_RETURN_IF_ERROR(out.Open(path));
  const uint64_t len = h.size();
  IRIS_RETURN_IF_ERROR(out.Write(&len, 8));
  IRIS_RETURN_IF_ERROR(out.Write(h.data(), h.size()));

  std::vector<uint16_t> buffers[2];
  buffers[0].resize(kChunkElements);
  buffers[1].resize(kChunkElements);
  int current = 0;
  int64_t fill = 0;
  std::future<absl::Status> pending;
  absl::Status status;
  auto flush = [&]() {
    if (pending.valid()) status.Update(pending.get());
    if (fill == 0 || !status.ok()) return;
    const uint16_t* data = buffers[current].data();
    const size_t bytes = static_cast<size_t>(fill) * 2;
    pending = std::async(std::launch::async, [&out, data, bytes] { return out.Write(data, bytes); });
    current ^= 1;
    fill = 0;
  };
  // The writer thread gets a core of its own: on a busy or small machine, OpenMP threads
  // competing with it (and being preempted inside a parallel region) cost far more than
  // generating on fewer cores. Generation (~3 GB/s per core) outruns the write anyway.
  const int threads = std::max(1, omp_get_max_threads() - 1);
  for (const TensorSpec& s : specs) {
    const TensorGenerator gen(seed, s.name, s.shape);
    for (int64_t done = 0; done < gen.numel();) {
      const int64_t n = std::min(gen.numel() - done, kChunkElements - fill);
      gen.Fill(done, n, buffers[current].data() + fill, threads);
      fill += n;
      done += n;
      if (fill == kChunkElements) {
        flush();
        if (!status.ok()) return status;
      }
    }
  }
  flush();
  if (pending.valid()) status.Update(pending.get());
  IRIS_RETURN_IF_ERROR(status);
  return out.Commit();
}

// Removes weights a previous run may have left (a stale index would shadow a new single file).
absl::Status RemoveOldWeights(const fs::path& dir) {
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        std::regex_match(name, kShard)) {
      fs::remove(entry.path(), ec);
      if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot remove old ", entry.path().string(), ": ", ec.message()));
    }
  }
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadTextFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Text-only presets take the tokenizer but not the VL chat template: their tokenizer_config.json
// carries Qwen2.5-Instruct's text template instead, and there is no chat_template.json.
absl::StatusOr<int> CopyTokenizer(const Preset& preset, const fs::path& from, const fs::path& to) {
  std::error_code ec;
  if (!fs::is_directory(from, ec)) {
    return absl::NotFoundError(absl::StrCat("--tokenizer-from ", from.string(), " is not a directory"));
  }
  const bool text_only = preset.family == core::ModelFamily::kQwen2Text;
  int copied = 0;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.json"}) {
    if (!fs::exists(from / name, ec)) continue;
    if (text_only && std::string_view(name) == "chat_template.json") continue;
    if (text_only && std::string_view(name) == "tokenizer_config.json") {
      IRIS_ASSIGN_OR_RETURN(std::string text, ReadTextFile(from / name));
      IRIS_RETURN_IF_ERROR(WriteTextFile((to / name).string(), TokenizerConfigJson(preset, text)));
      ++copied;
      continue;
    }
    fs::copy_file(from / name, to / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot copy ", (from / name).string(), " to ", to.string(), ": ", ec.message()));
    }
    ++copied;
  }
  return copied;
}

}  // namespace

absl::StatusOr<WriteSummary> WriteSyntheticModel(const Preset& preset, const WriteOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.out_dir.empty()) return absl::InvalidArgumentError("no output directory given (--out)");
  if (options.max_shard_bytes == 0) return absl::InvalidArgumentError("the maximum shard size must be positive");
  const fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create output directory ", dir.string(), ": ",
                                                    ec ? ec.message() : "not a directory"));
  }

  WriteSummary summary;
  IRIS_RETURN_IF_ERROR(WriteTextFile((dir / "config.json").string(), ConfigJson(preset)));
  IRIS_RETURN_IF_ERROR(WriteTextFile((dir / "generation_config.json").string(), GenerationConfigJson(preset)));
  if (preset.family != core::ModelFamily::kQwen2Text) {
    IRIS_RETURN_IF_ERROR(WriteTextFile((dir / "preprocessor_config.json").string(), PreprocessorConfigJson(preset)));
  }
  if (!options.tokenizer_from.empty()) {
    IRIS_ASSIGN_OR_RETURN(summary.tokenizer_files, CopyTokenizer(preset, options.tokenizer_from, dir));
  }
  const std::vector<TensorSpec> all_specs = PresetTensors(preset, options.vision_only);
  if (options.config_only) {
    summary.tensors = static_cast<int64_t>(all_specs.size());
    summary.parameters = ParameterCount(all_specs);
    summary.bytes = static_cast<uint64_t>(summary.parameters) * 2;
    summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return summary;
  }
  if (preset.config_only) {
    return absl::InvalidArgumentError(absl::StrCat("preset ", preset.name, " is config-only (",
                                                   ParameterCount(all_specs) * 2 / 1000000000,
                                                   " GB of weights): pass --config-only to write its JSON files"));
  }
  IRIS_RETURN_IF_ERROR(RemoveOldWeights(dir));

  // Shards are cut in model order; inside a file tensors are sorted by name, as
  // safetensors' own writer does.
  const std::vector<TensorSpec>& specs = all_specs;
  std::vector<std::vector<TensorSpec>> shards;
  uint64_t shard_bytes = 0;
  for (const TensorSpec& s : specs) {
    const uint64_t bytes = static_cast<uint64_t>(Numel(s)) * 2;
    if (shards.empty() || (shard_bytes > 0 && shard_bytes + bytes > options.max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(s);
    shard_bytes += bytes;
    summary.bytes += bytes;
  }
  for (auto& shard : shards) {
    std::sort(shard.begin(), shard.end(),
              [](const TensorSpec& a, const TensorSpec& b) { return a.name < b.name; });
  }

  if (shards.size() == 1) {
    IRIS_RETURN_IF_ERROR(WriteShard((dir / "model.safetensors").string(), preset.seed, shards[0]));
  } else {
    nlohmann::json index;
    index["metadata"]["total_size"] = summary.bytes;
    index["weight_map"] = nlohmann::json::object();
    for (size_t k = 0; k < shards.size(); ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
      IRIS_RETURN_IF_ERROR(WriteShard((dir / name).string(), preset.seed, shards[k]));
      for (const TensorSpec& s : shards[k]) index["weight_map"][s.name] = name;
    }
    IRIS_RETURN_IF_ERROR(WriteTextFile((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
  }

  summary.tensors = static_cast<int64_t>(specs.size());
  summary.parameters = ParameterCount(specs);
  summary.files = static_cast<int>(shards.size());
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace iris::tools
