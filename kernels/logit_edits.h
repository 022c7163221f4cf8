// What a greedy pick changes in its row of logits before the argmax, so that a device can pick
// it where the logits are (only the id comes back) even when the request has a repetition penalty
// or masks its end ids (min_tokens): HF's penalty on each id seen so far (score < 0 ? score *
// penalty : score / penalty, each id once) and the masked ids set to -inf, in llm::Sampler's
// order (masks, then the penalty). The edits travel to the device packed in one int32 buffer.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/packed_logit_edits.h"

namespace iris::kernels {

class Device;

// The edits of a step's logit rows, row by row in the rows' order.
struct LogitEdits {
  std::vector<float> penalty;            // per row; 1 = none
  std::vector<int32_t> penalized_begin{0};  // row r's penalized ids: penalized[begin[r], begin[r + 1])
  std::vector<int32_t> masked_begin{0};     // likewise for masked
  std::vector<int32_t> penalized;        // distinct within a row (AddRow drops repeats)
  std::vector<int32_t> masked;           // likewise

  void Clear();
  void AddRow(float row_penalty, std::span<const int32_t> row_penalized, std::span<const int32_t> row_masked);
  int64_t rows() const { return static_cast<int64_t>(penalty.size()); }
  // No row changes anything.
  bool empty() const { return penalized.empty() && masked.empty(); }

  // The packed form EditLogitRows reads: [penalty bits per row, penalized_begin (rows + 1),
  // masked_begin (rows + 1), penalized ids, masked ids]; PackedSize() int32s. View gives the
  // pointers into such a buffer (Pack's output, or its copy in a device's memory).
  int64_t PackedSize() const;
  void Pack(int32_t* out) const;
  PackedLogitEdits View(const int32_t* packed) const;
};

// Applies the packed edits (LogitEdits::View of a buffer in the device's memory) to logits [rows, vocab] in
// place; ids outside [0, vocab) are ignored, as the sampler ignores them.
void EditLogitRows(Device& device, float* logits, int64_t rows, int64_t vocab, const PackedLogitEdits& edits);

}  // namespace iris::kernels
