#include "llm/bpe.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "llm/byte_level.h"
#include "llm/utf8.h"

namespace iris::llm {
namespace {

constexpr uint32_t kNoToken = std::numeric_limits<uint32_t>::max();

}  // namespace

void BpeSpec::AddToken(std::string_view token, int64_t id) {
  vocab.push_back({static_cast<uint32_t>(vocab_text.size()), static_cast<uint32_t>(token.size()), id});
  vocab_text.append(token);
}

void BpeSpec::AddMerge(std::string_view left, std::string_view right) {
  merges.push_back({static_cast<uint32_t>(merge_text.size()), static_cast<uint32_t>(left.size()),
                    static_cast<uint32_t>(right.size())});
  merge_text.append(left);
  merge_text.append(right);
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(BpeSpec spec) {
  if (spec.vocab_text.size() >= kNoToken || spec.merge_text.size() >= kNoToken) {
    return absl::InvalidArgumentError("tokenizer vocabulary or merges too large");
  }
  std::unique_ptr<BpeModel> m(new BpeModel);
  m->num_tokens_ = static_cast<int64_t>(spec.vocab.size());
  m->num_merges_ = static_cast<int64_t>(spec.merges.size());

  // Vocabulary: ids may have holes but not repeats; token texts must be unique.
  int64_t limit = 0;
  for (const BpeSpec::Token& t : spec.vocab) {
    if (t.id < 0 || t.id >= std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer vocab: id ", t.id, " of token \"",
                                                     spec.vocab_text.substr(t.offset, t.length), "\" out of range"));
    }
    limit = std::max(limit, t.id + 1);
  }
  m->vocab_text_ = std::move(spec.vocab_text);
  m->token_offset_.assign(limit, kNoToken);
  m->token_length_.assign(limit, 0);
  m->token_to_id_.reserve(spec.vocab.size());
  for (const BpeSpec::Token& t : spec.vocab) {
    const std::string_view text(m->vocab_text_.data() + t.offset, t.length);
    if (m->token_offset_[t.id] != kNoToken) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer vocab: id ", t.id, " is given to both \"",
                                                     std::string(m->IdToToken(static_cast<int32_t>(t.id))), "\" and \"", std::string(text), "\""));
    }
    if (!m->token_to_id_.emplace(text, static_cast<int32_t>(t.id)).second) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer vocab: token \"", std::string(text), "\" appears twice"));
    }
    m->token_offset_[t.id] = t.offset;
    m->token_length_[t.id] = t.length;
  }

  // Raw bytes per token (as the ByteLevel decoder does: a token with a character outside the byte
  // alphabet stands for its own UTF-8 bytes).
  m->bytes_offset_.resize(limit + 1);
  m->bytes_text_.reserve(m->vocab_text_.size());
  for (int64_t id = 0; id < limit; ++id) {
    m->bytes_offset_[id] = static_cast<uint32_t>(m->bytes_text_.size());
    if (m->token_offset_[id] == kNoToken) continue;
    const std::string_view text = m->IdToToken(static_cast<int32_t>(id));
    if (!ByteLevelToBytes(text, &m->bytes_text_)) m->bytes_text_.append(text);
  }
  m->bytes_offset_[limit] = static_cast<uint32_t>(m->bytes_text_.size());

  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &ch);
    m->byte_id_[b] = m->TokenToId(ch);
    if (m->byte_id_[b] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer vocab: byte 0x", absl::Hex(b, absl::kZeroPad2), " (byte-level \"", ch,
                       "\") has no token; a byte-level BPE vocabulary needs all 256"));
    }
  }

  // Merges: rank = position in the list; a repeated pair keeps its last rank (as HF does).
  m->merges_.reserve(spec.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const BpeSpec::Merge& mg = spec.merges[rank];
    const std::string_view left(spec.merge_text.data() + mg.offset, mg.left_length);
    const std::string_view right(spec.merge_text.data() + mg.offset + mg.left_length, mg.right_length);
    joined.assign(left);
    joined.append(right);
    const int32_t a = m->TokenToId(left), b = m->TokenToId(right), ab = m->TokenToId(joined);
    if (a < 0 || b < 0 || ab < 0) {
      const std::string_view missing = a < 0 ? left : b < 0 ? right : std::string_view(joined);
      return absl::InvalidArgumentError(absl::StrCat("tokenizer merges: merge ", rank, " (\"", std::string(left), "\" + \"", std::string(right),
                                                     "\") uses \"", std::string(missing), "\", which is not in the vocabulary"));
    }
    m->merges_[PairKey(a, b)] = MergeTarget{static_cast<int32_t>(rank), ab};
  }
  return m;
}

int32_t BpeModel::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

bool BpeModel::HasId(int32_t id) const {
  return id >= 0 && id < id_limit() && token_offset_[id] != kNoToken;
}

std::string_view BpeModel::IdToToken(int32_t id) const {
  return std::string_view(vocab_text_.data() + token_offset_[id], token_length_[id]);
}

std::string_view BpeModel::IdToBytes(int32_t id) const {
  return std::string_view(bytes_text_.data() + bytes_offset_[id], bytes_offset_[id + 1] - bytes_offset_[id]);
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.size() == 1) {
    ids->push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    absl::ReaderMutexLock lock(&cache_mu_);
    auto it = cache_.find(absl::string_view(word.data(), word.size()));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = ids->size();
  MergeWord(word, ids);
  if (cacheable) {
    std::vector<int32_t> entry(ids->begin() + start, ids->end());
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(word, std::move(entry));
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  // Symbols form a linked list over the word's bytes; a merge folds the right symbol into the left.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;  // -1 at the ends
  };
  // Candidate merge of the symbol at `pos` with its successor. Min-heap by (rank, pos): the lowest rank
  // first, the leftmost among equals.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  const int32_t n = static_cast<int32_t>(word.size());
  symbols.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) symbols[i] = {byte_id_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};

  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, it->second.id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
    // Stale when either side changed since the candidate was queued.
    auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.rank != top.rank || it->second.id != top.id) continue;
    Symbol& right = symbols[left.next];
    left.id = top.id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    right.id = -1;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace iris::llm
