#include "vision/opencv_plugin_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace iris::vision::detail {
namespace {

std::vector<std::string> Candidates() {
  std::vector<std::string> paths;
  // Set: the one place to look (a deployment's choice, and how a test leaves the plugin out).
  if (const char* env = std::getenv("IRIS_OPENCV_PLUGIN"); env != nullptr && *env != '\0') return {env};
#ifdef IRIS_OPENCV_PLUGIN_BUILD_PATH
  paths.push_back(IRIS_OPENCV_PLUGIN_BUILD_PATH);
#endif
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    paths.push_back(dir + opencv_plugin::kPluginFileName);
    paths.push_back(dir + "../lib/iris/" + opencv_plugin::kPluginFileName);
  }
  return paths;
}

absl::StatusOr<opencv_plugin::ImdecodeFn> Load() {
  std::vector<std::string> failures;
  for (const std::string& path : Candidates()) {
    if (access(path.c_str(), R_OK) != 0) {
      failures.push_back(absl::StrCat(path, ": not there"));
      continue;
    }
    // Never unloaded: the function pointer is used for the process's life.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failures.push_back(why != nullptr ? std::string(why) : absl::StrCat(path, ": dlopen failed"));
      continue;
    }
    void* symbol = dlsym(handle, opencv_plugin::kImdecodeSymbol);
    if (symbol == nullptr) {
      failures.push_back(absl::StrCat(path, ": no ", opencv_plugin::kImdecodeSymbol));
      dlclose(handle);
      continue;
    }
    return reinterpret_cast<opencv_plugin::ImdecodeFn>(symbol);
  }
  return absl::UnimplementedError(absl::StrCat(
      "WebP, BMP and TIFF images need iris's OpenCV plugin (", opencv_plugin::kPluginFileName,
      "), which could not be loaded (set IRIS_OPENCV_PLUGIN to its path): ", absl::StrJoin(failures, "; ")));
}

}  // namespace

absl::StatusOr<opencv_plugin::ImdecodeFn> OpenCvImdecode() {
  static const absl::StatusOr<opencv_plugin::ImdecodeFn>* const loaded =
      new absl::StatusOr<opencv_plugin::ImdecodeFn>(Load());
  return *loaded;
}

}  // namespace iris::vision::detail
