#include "structured/position_mask.h"

#include <algorithm>
#include <string_view>

#include "structured/error.h"

namespace ossrt::structured {

namespace {

// Below this many ids a list is cheaper to apply and store than a bitmask (6,284 words for o200k).
constexpr int32_t kListLimit = 2048;
// Configuration steps one state's walk may take: a schema state takes ~0.5M (one configuration
// through the trie); 30M is well under a second.
constexpr int64_t kMaxMaskWalkWork = 30'000'000;

// Advances `from` (closed) by one byte into `to` (closed); returns whether the bottom was popped.
// The common case, one configuration in the middle of a rule, skips the closure.
bool advance(const Automaton& a, StackArena& arena, const std::vector<Config>& from, uint8_t byte,
             std::vector<Config>& stepped, std::vector<Config>& to) {
  step(a, from, byte, stepped);
  if (stepped.empty()) {
    to.clear();
    return false;
  }
  if (stepped.size() == 1 && !(a.flags(stepped[0].state) & (kAccepting | kHasCalls))) {
    to.assign(stepped.begin(), stepped.end());
    return false;
  }
  return closure(a, arena, stepped, to).reached_bottom;
}

SuffixTrie build_suffix_trie(const Vocabulary& v, std::vector<std::pair<int32_t, int32_t>>& entries) {
  // entries: (token, offset where its suffix starts)
  auto suffix = [&](const std::pair<int32_t, int32_t>& e) {
    return std::string_view(v.bytes(e.first)).substr(size_t(e.second));
  };
  std::sort(entries.begin(), entries.end(), [&](const auto& x, const auto& y) {
    const auto sx = suffix(x), sy = suffix(y);
    return sx != sy ? sx < sy : x.first < y.first;
  });
  entries.erase(std::unique(entries.begin(), entries.end(),
                            [&](const auto& x, const auto& y) { return x.first == y.first && suffix(x) == suffix(y); }),
                entries.end());
  SuffixTrie t;
  std::vector<int32_t> path;
  std::string_view prev;
  bool have_prev = false;
  for (const auto& e : entries) {
    const std::string_view s = suffix(e);
    size_t lcp = 0;
    if (have_prev) {
      const size_t m = std::min(prev.size(), s.size());
      while (lcp < m && prev[lcp] == s[lcp]) ++lcp;
    }
    if (!have_prev || lcp != s.size() || prev.size() != s.size()) {
      while (path.size() > lcp) {
        t.nodes[size_t(path.back())].end = int32_t(t.nodes.size());
        path.pop_back();
      }
      for (size_t d = lcp; d < s.size(); ++d) {
        path.push_back(int32_t(t.nodes.size()));
        t.nodes.push_back(
            SuffixTrie::Node{uint8_t(s[d]), uint16_t(d + 1), -1, int32_t(t.tokens.size()), int32_t(t.tokens.size())});
      }
    }
    // Suffixes are never empty here, so the path is never empty.
    SuffixTrie::Node& node = t.nodes[size_t(path.back())];
    if (node.first_token == node.last_token) node.first_token = node.last_token = int32_t(t.tokens.size());
    t.tokens.push_back(e.first);
    node.last_token = int32_t(t.tokens.size());
    prev = s;
    have_prev = true;
  }
  while (!path.empty()) {
    t.nodes[size_t(path.back())].end = int32_t(t.nodes.size());
    path.pop_back();
  }
  return t;
}

}  // namespace

PositionMask compute_position_mask(const Automaton& a, const Vocabulary& v, int32_t state) {
  const auto& trie = v.trie();
  StackArena arena;
  std::vector<std::vector<Config>> levels(size_t(v.max_token_bytes()) + 1);
  levels[0] = {Config{state, -1}};  // not closed: the first byte uses this state's own edges
  std::vector<Config> stepped;
  std::vector<uint32_t> accepted(size_t(v.mask_words()), 0);
  int32_t num_accepted = 0;
  std::vector<int32_t> exit_nodes;  // nodes where the bottom rule ended with bytes possibly left
  auto accept = [&](int32_t token) {
    if (!test_bit(accepted, token)) {
      set_bit(accepted, token);
      ++num_accepted;
    }
  };
  int64_t work = 0;
  for (int32_t i = 0; i < int32_t(trie.size());) {
    const Vocabulary::TrieNode& nd = trie[size_t(i)];
    std::vector<Config>& cur = levels[nd.depth];
    // An ambiguous grammar keeps many configurations alive through every trie node; bound the
    // walk so that such a grammar fails its request instead of stalling the engine.
    work += int64_t(levels[size_t(nd.depth - 1)].size());
    if (work > kMaxMaskWalkWork) throw StructuredError("", "the grammar is too ambiguous to compute token masks for");
    const bool ended = advance(a, arena, levels[size_t(nd.depth - 1)], nd.byte, stepped, cur);
    if (nd.token >= 0 && (ended || !cur.empty())) {
      accept(nd.token);
      auto [b, e] = v.duplicates().equal_range(i);
      for (; b != e; ++b) accept(b->second);
    }
    if (ended && nd.end > i + 1) exit_nodes.push_back(i);
    i = cur.empty() ? nd.end : i + 1;
  }

  std::vector<std::pair<int32_t, int32_t>> entries;
  for (int32_t i : exit_nodes) {
    const int32_t depth = trie[size_t(i)].depth;
    for (int32_t j = i + 1; j < trie[size_t(i)].end; ++j) {
      const int32_t tok = trie[size_t(j)].token;
      if (tok >= 0 && !test_bit(accepted, tok)) entries.push_back({tok, depth});
      auto [b, e] = v.duplicates().equal_range(j);
      for (; b != e; ++b)
        if (!test_bit(accepted, b->second)) entries.push_back({b->second, depth});
    }
  }

  PositionMask m;
  m.num_accepted = num_accepted;
  {
    std::vector<int32_t> toks;
    for (const auto& e : entries) toks.push_back(e.first);
    std::sort(toks.begin(), toks.end());
    m.num_uncertain = int32_t(std::unique(toks.begin(), toks.end()) - toks.begin());
  }
  m.uncertain = build_suffix_trie(v, entries);
  if (num_accepted <= kListLimit) {
    m.kind = PositionMask::Kind::List;
    for (size_t w = 0; w < accepted.size(); ++w)
      for (uint32_t bits = accepted[w]; bits; bits &= bits - 1)
        m.ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
  } else if (v.num_ordinary() - num_accepted <= kListLimit) {
    m.kind = PositionMask::Kind::Complement;
    const auto& ord = v.ordinary_mask();
    for (size_t w = 0; w < accepted.size(); ++w)
      for (uint32_t bits = ord[w] & ~accepted[w]; bits; bits &= bits - 1)
        m.ids.push_back(int32_t(w * 32 + size_t(__builtin_ctz(bits))));
  } else {
    m.kind = PositionMask::Kind::Bits;
    m.bits = std::move(accepted);
  }
  return m;
}

void PositionMask::apply(std::span<uint32_t> mask, const Vocabulary& vocab, std::vector<uint32_t>& scratch) const {
  switch (kind) {
    case Kind::List:
      for (int32_t id : ids) set_bit(mask, id);
      break;
    case Kind::Bits:
      for (size_t w = 0; w < bits.size(); ++w) mask[w] |= bits[w];
      break;
    case Kind::Complement: {
      const auto& ord = vocab.ordinary_mask();
      scratch.assign(ord.begin(), ord.end());
      for (int32_t id : ids) scratch[size_t(id) >> 5] &= ~(1u << (uint32_t(id) & 31));
      for (size_t w = 0; w < scratch.size(); ++w) mask[w] |= scratch[w];
      break;
    }
  }
}

size_t PositionMask::memory_bytes() const {
  return sizeof(*this) + ids.capacity() * 4 + bits.capacity() * 4 +
         uncertain.nodes.capacity() * sizeof(SuffixTrie::Node) + uncertain.tokens.capacity() * 4;
}

void walk_uncertain(const Automaton& a, StackArena& arena, const SuffixTrie& trie, const std::vector<Config>& start,
                    std::span<uint32_t> mask) {
  if (trie.empty() || start.empty()) return;
  int32_t max_depth = 0;
  for (const auto& n : trie.nodes) max_depth = std::max<int32_t>(max_depth, n.depth);
  std::vector<std::vector<Config>> levels(size_t(max_depth) + 1);
  levels[0] = start;
  std::vector<Config> stepped;
  for (int32_t i = 0; i < int32_t(trie.nodes.size());) {
    const SuffixTrie::Node& nd = trie.nodes[size_t(i)];
    std::vector<Config>& cur = levels[nd.depth];
    const bool ended = advance(a, arena, levels[size_t(nd.depth - 1)], nd.byte, stepped, cur);
    if (ended || !cur.empty())
      for (int32_t k = nd.first_token; k < nd.last_token; ++k) set_bit(mask, trie.tokens[size_t(k)]);
    i = cur.empty() ? nd.end : i + 1;
  }
}

}  // namespace ossrt::structured
