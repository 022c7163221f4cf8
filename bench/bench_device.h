// The device a bench's --device flag names, made one way for every bench.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace iris::bench {

// "cpu": the process's default CPU device (its OpenMP team is this thread's); otherwise ("cuda",
// "cuda:N") a device made here, kept alive in *owned.
inline absl::StatusOr<kernels::Device*> DeviceNamed(const std::string& name, std::unique_ptr<kernels::Device>* owned) {
  if (name == "cpu") return &kernels::DefaultCpuDevice();
  kernels::DeviceOptions options;
  options.name = name;
  absl::StatusOr<std::unique_ptr<kernels::Device>> made = kernels::CreateDevice(options);
  if (!made.ok()) return made.status();
  *owned = std::move(*made);
  return owned->get();
}

}  // namespace iris::bench
