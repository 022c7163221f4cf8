#include "llm/decode_graph.h"

#include <algorithm>

#include "kernels/paged_attention.h"

namespace iris::llm {

std::vector<int> DecodeGraphBatchSizes(int max_seqs) {
  std::vector<int> sizes;
  for (int n : {1, 2, 4}) {
    if (n < max_seqs) sizes.push_back(n);
  }
  for (int n = 8; n < max_seqs; n += 8) sizes.push_back(n);
  if (max_seqs > 0) sizes.push_back(max_seqs);
  return sizes;
}

int DecodeGraphSize(std::span<const int> sizes, int num_seqs) {
  const auto it = std::lower_bound(sizes.begin(), sizes.end(), num_seqs);
  return it == sizes.end() ? 0 : *it;
}

bool IsGraphableDecode(const DecoderBatch& batch, int max_blocks_per_seq) {
  const int seqs = batch.num_seqs();
  if (seqs == 0 || batch.num_rows() != seqs || !batch.embed_rows.empty() ||
      batch.max_blocks_per_seq > max_blocks_per_seq || static_cast<int>(batch.logit_rows.size()) != seqs) {
    return false;
  }
  for (int s = 0; s < seqs; ++s) {
    if (batch.logit_rows[s] != s || batch.query_start[s] != s) return false;
  }
  return true;
}

void PadDecodeBatch(const DecoderBatch& batch, int size, int max_blocks_per_seq, DecoderBatch* padded) {
  const int seqs = batch.num_seqs();
  const int width = batch.max_blocks_per_seq;
  padded->Clear(max_blocks_per_seq);
  padded->picks_only = batch.picks_only;
  padded->token_ids = batch.token_ids;
  padded->token_ids.resize(size, 0);
  for (int a = 0; a < 3; ++a) {
    padded->positions[a] = batch.positions[a];
    padded->positions[a].resize(size, 0);
  }
  padded->slot_mapping = batch.slot_mapping;
  padded->slot_mapping.resize(size, kernels::kPadSlot);
  padded->query_start.resize(size + 1);
  padded->logit_rows.resize(size);
  for (int s = 0; s <= size; ++s) padded->query_start[s] = s;
  for (int s = 0; s < size; ++s) padded->logit_rows[s] = s;
  padded->context_lens = batch.context_lens;
  padded->context_lens.resize(size, 1);
  padded->block_tables.assign(static_cast<size_t>(size) * max_blocks_per_seq, 0);
  for (int s = 0; s < seqs; ++s) {
    std::copy_n(batch.block_tables.begin() + static_cast<size_t>(s) * width, width,
                padded->block_tables.begin() + static_cast<size_t>(s) * max_blocks_per_seq);
  }
}

}  // namespace iris::llm
