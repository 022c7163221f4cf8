// Decode-only steps replayed from recorded device graphs (CUDA graphs). A step that only decodes —
// one new row per sequence, every row's logits wanted — costs ~10 launches per layer whose host
// time, not their work, bounds a small batch on a GPU. Such a step is padded to the next of a few
// fixed batch sizes and a fixed block-table width, so that every launch of it has the same
// arguments and reads its inputs from the same addresses step after step; each size's launches
// are recorded once and then replayed as one. This file holds the host side of that: which sizes,
// which steps qualify, and the padding. llm::Decoder keeps the graphs.
#pragma once

#include <span>
#include <vector>

#include "llm/decoder.h"

namespace iris::llm {

// 1, 2, 4, 8, then every multiple of 8 up to max_seqs, and max_seqs itself (as vLLM's capture
// sizes: a step pads to at most 7 rows more, 2x at the smallest sizes).
std::vector<int> DecodeGraphBatchSizes(int max_seqs);

// The smallest of `sizes` (ascending) that holds `num_seqs` sequences; 0 when none does.
int DecodeGraphSize(std::span<const int> sizes, int num_seqs);

// A step a decode graph can run: at least one sequence, each with exactly one new row and its
// logits wanted, logit rows in row order, no given (image) embeddings, and no sequence with more
// than `max_blocks_per_seq` blocks.
bool IsGraphableDecode(const DecoderBatch& batch, int max_blocks_per_seq);

// `batch` (graphable) as a step of `size` sequences with block tables `max_blocks_per_seq` wide,
// in *padded (its vectors reused). The padding sequences after the real ones are one token each:
// id 0 at position 0, written to kernels::kPadSlot (nowhere), attending to the token in slot 0 of
// block 0 (whatever it holds: padding rows are independent of the real ones in every op), their
// logits computed and not returned. picks_only is carried over.
void PadDecodeBatch(const DecoderBatch& batch, int size, int max_blocks_per_seq, DecoderBatch* padded);

}  // namespace iris::llm
