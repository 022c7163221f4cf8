// Sampled picks where the logits are: each row drawn as llm::Sampler::Sample draws it, from the
// row's settings and the uniform its request's generator gave (kernels/row_draw.h), so that on a
// GPU only one int per row comes back instead of the vocabulary's floats (39 MB a step at batch
// 64 for Qwen's 152k vocabulary, then ~0.2 ms of host work a row).
//
// The draw, for a row x with temperature t, top_k k, top_p p and uniform u (greedy rows: the
// first index of the largest value, NaN never winning, 0 if nothing is above -inf):
//   1. v = x / t, a NaN as -inf; m = max v. If m is +-inf: v's argmax, as greedy.
//   2. The candidates: v >= the k-th largest v (all with k off or >= the vocabulary; ties with
//      the k-th value stay, as HF and vLLM keep them). q = e^(v - m) (kernels::Exp) for a
//      candidate, 0 otherwise.
//   3. With top_p < 1: `last` = the largest q such that the mass of q >= last reaches
//      need = (p - kTopPSlack) * sum(q); the nucleus is every q > last, then the q equal to last
//      in id order until the mass reaches need. Without: the q > 0 (last = 0, no ties).
//   4. target = u * (the nucleus's mass); the pick is the token at which the cumulative mass
//      passes target, walking the q > last in id order, then the ties in id order.
// Which is HF's distribution (temperature, top-k, top-p on the softmax of what top-k kept) with
// one fixed order for the walk, so the same u picks the same token on every device, up to the
// rounding of the sums (a target within ~1e-16 of a boundary).
#pragma once

#include <cstdint>

#include "kernels/row_draw.h"

namespace iris::kernels {

class Device;

// out[r] = row r's pick from logits [rows, vocab] (overwritten: the rows are the op's scratch)
// with draws[r]. `draws` and `out` are device memory.
void SampleRows(Device& device, float* logits, int64_t rows, int64_t vocab, const RowDraw* draws, int32_t* out);

}  // namespace iris::kernels
