// Row movement ops: what model code used to do with host loops and memcpy (the vision encoder's
// window order and its inverse, the decoder's embedding lookup, placing image embeddings, picking
// the rows that reach lm_head, greedy picks from logits). Rows are `width` float32 values;
// indices are device memory.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "kernels/device.h"

namespace iris::kernels {

// dst[i, :] = src[index[i], :] for i < index.size().
void GatherRows(Device& device, const float* src, int64_t width, std::span<const int32_t> index, float* dst);

// dst[index[i], :] = src[i, :] for i < index.size() (indices distinct; other rows untouched).
void ScatterRows(Device& device, const float* src, int64_t width, std::span<const int32_t> index, float* dst);

// out[i, :] = table[ids[i], :] as float32; table is [vocab, width] F32, BF16 or F16 on the device.
// Ids must be in [0, vocab): callers validate them where they enter (a bad id is a bug here: the
// CPU stops on it; a GPU, whose ids are in its own memory, gives its row as NaN).
void EmbeddingLookup(Device& device, const core::Tensor& table, std::span<const int32_t> ids, float* out);

// out[i] = the first index of the largest value of row i of logits [rows, vocab] (greedy
// decoding: the lowest id wins ties, NaN never wins, 0 when a row is all NaN or -inf). out is
// device memory.
void ArgmaxRows(Device& device, const float* logits, int64_t rows, int64_t vocab, int32_t* out);

}  // namespace iris::kernels
