#pragma once
// Byte-level BPE over raw bytes: the vocabulary of tokenizer.json with its ByteLevel spelling
// undone, and the merge algorithm of Hugging Face's BPE model (merge the adjacent pair with the
// lowest merge rank; equal ranks merge leftmost first), with `ignore_merges` (a piece that is
// itself a token is emitted whole, as tiktoken does).
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/flat_tables.h"

namespace ossrt::tokenizer_detail {

struct BpeVocab {
  std::vector<std::string> token_bytes;   // indexed by id; regular tokens come first
  int32_t regular_count = 0;              // ids [0, regular_count) are BPE tokens
  std::array<int32_t, 256> byte_token{};  // the token of each single byte (all 256 must exist)
  bool ignore_merges = false;
  PieceTable pieces;
  MergeTable merges;
};

// Pieces up to this many bytes merge by rescanning a small array (fast for the short pieces of
// ordinary text); longer ones (runs of spaces, long words, base64) use a heap so a 10k-byte piece
// costs O(n log n) instead of O(n^2).
inline constexpr size_t kScanMergeLimit = 64;

// Appends the tokens of one pre-tokenized piece to `out`.
void encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out);

// The two merge strategies, exposed so a test can check they agree on every input.
void merge_by_scan(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out);
void merge_by_heap(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out);

}  // namespace ossrt::tokenizer_detail
