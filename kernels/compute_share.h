// Two issuers on one pool of compute: the engine's decoder and the vision encoder's worker, each
// with a device object of its own on the same CPU cores. While both have work they split the
// cores; while one is idle the other takes them all. So a running request's tokens never wait for
// an image being encoded (each side keeps cores of its own), and no core idles while either side
// has work (which a fixed split, --encoder-cpus, leaves to chance: its decoder never uses the
// encoder's cores, nor the encoder the decoder's).
//
// Each side says when it starts and stops having work (SetBusy, any thread); each device takes its
// current share between ops (Device::Rebalance, on its own issuing thread), so a change reaches a
// side within one of its ops.
#pragma once

#include <algorithm>
#include <atomic>

namespace iris::kernels {

class ComputeShare {
 public:
  enum Side { kDecoder = 0, kEncoder = 1 };

  explicit ComputeShare(int cores) : cores_(std::max(1, cores)) {}

  int cores() const { return cores_; }

  void SetBusy(Side side, bool busy) { busy_[side].store(busy, std::memory_order_relaxed); }
  bool busy(Side side) const { return busy_[side].load(std::memory_order_relaxed); }

  // The threads `side` may run now: every core while the other side is idle; else its part of the
  // split. The decoder's part is the smaller half (its small-batch steps are bound by memory
  // bandwidth, which one core's worth of threads already draws most of; the encoder's matmuls
  // scale with cores), and neither side ever gets none.
  int ThreadsFor(Side side) const {
    const Side other = side == kDecoder ? kEncoder : kDecoder;
    if (!busy(other) || cores_ == 1) return cores_;
    const int decoder = std::max(1, cores_ / 2);
    return side == kDecoder ? decoder : std::max(1, cores_ - decoder);
  }

 private:
  const int cores_;
  std::atomic<bool> busy_[2] = {false, false};
};

}  // namespace iris::kernels
