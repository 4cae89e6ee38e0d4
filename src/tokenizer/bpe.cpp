#include "tokenizer/bpe.h"

#include <algorithm>
#include <limits>

namespace ossrt::tokenizer_detail {
namespace {

constexpr int32_t kNoMerge = std::numeric_limits<int32_t>::max();

int32_t rank_of(const Merge& m) { return m.rank < 0 ? kNoMerge : m.rank; }

}  // namespace

void merge_by_scan(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  const size_t n = piece.size();
  if (n == 0) return;
  // ids[i] is the i-th current part; pair[i] is the merge of parts i and i+1.
  std::array<int32_t, kScanMergeLimit> ids_storage;
  std::array<Merge, kScanMergeLimit> pair_storage;
  std::vector<int32_t> ids_heap;
  std::vector<Merge> pair_heap;
  int32_t* ids = ids_storage.data();
  Merge* pair = pair_storage.data();
  if (n > kScanMergeLimit) {  // only reached from tests; encode_piece routes long pieces to the heap
    ids_heap.resize(n);
    pair_heap.resize(n);
    ids = ids_heap.data();
    pair = pair_heap.data();
  }
  for (size_t i = 0; i < n; ++i) ids[i] = vocab.byte_token[static_cast<uint8_t>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) pair[i] = vocab.merges.find(ids[i], ids[i + 1]);
  size_t count = n;
  while (count > 1) {
    size_t best = 0;
    int32_t best_rank = kNoMerge;
    for (size_t i = 0; i + 1 < count; ++i) {
      if (rank_of(pair[i]) < best_rank) {  // strict: equal ranks keep the leftmost
        best_rank = rank_of(pair[i]);
        best = i;
      }
    }
    if (best_rank == kNoMerge) break;
    ids[best] = pair[best].merged_id;
    std::copy(ids + best + 2, ids + count, ids + best + 1);
    std::copy(pair + best + 1, pair + count - 1, pair + best);
    --count;
    if (best > 0) pair[best - 1] = vocab.merges.find(ids[best - 1], ids[best]);
    if (best + 1 < count) pair[best] = vocab.merges.find(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids, ids + count);
}

void merge_by_heap(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  const auto n = static_cast<int32_t>(piece.size());
  if (n == 0) return;
  // A doubly linked list of parts; node i starts as byte i and keeps its index (its original
  // position) when it absorbs its right neighbour, so (rank, index) orders merges exactly like
  // the reference: lowest rank first, leftmost first among equal ranks.
  struct Node {
    int32_t id, prev, next;
    uint32_t version;  // bumped whenever the node changes or dies; stale heap entries mismatch
  };
  struct Candidate {
    int32_t rank, left, right;
    uint32_t left_version, right_version;
    int32_t merged_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::vector<Node> nodes(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    nodes[i] = Node{vocab.byte_token[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, 0};
  }
  std::vector<Candidate> heap;
  heap.reserve(static_cast<size_t>(n));
  auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = nodes[left].next;
    if (right < 0) return;
    const Merge m = vocab.merges.find(nodes[left].id, nodes[right].id);
    if (m.rank < 0) return;
    heap.push_back({m.rank, left, right, nodes[left].version, nodes[right].version, m.merged_id});
    std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const Candidate c = heap.back();
    heap.pop_back();
    Node& left = nodes[c.left];
    if (left.version != c.left_version || left.next != c.right || nodes[c.right].version != c.right_version) {
      continue;  // one side changed since this pair was queued
    }
    Node& right = nodes[c.right];
    left.id = c.merged_id;
    left.next = right.next;
    ++left.version;
    ++right.version;
    if (right.next >= 0) nodes[right.next].prev = c.left;
    push_pair(left.prev);
    push_pair(c.left);
  }
  for (int32_t i = 0; i >= 0; i = nodes[i].next) out.push_back(nodes[i].id);
}

void encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(vocab.byte_token[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (vocab.ignore_merges) {
    const int32_t whole = vocab.pieces.find(piece);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  if (piece.size() <= kScanMergeLimit) {
    merge_by_scan(vocab, piece, out);
  } else {
    merge_by_heap(vocab, piece, out);
  }
}

}  // namespace ossrt::tokenizer_detail
