#pragma once
// Suffix decoding (vLLM's "suffix" method, after SuffixDecoding, Oliaro et al. 2024): the drafter
// keeps a suffix tree over each running request's prompt and output and one over the outputs of
// recent finished requests. To draft, it finds where the sequence's last tokens occurred before and
// follows the most frequent continuation while the running product of its empirical probabilities
// stays at or above min_token_prob, so the draft is long where the text repeats (code edits, agent
// loops) and short or empty where it does not. Guesses are verified like any other (engine.cpp).
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/drafter.h"

namespace ossrt {

// Counts of every token string of length 1..max_depth in the sequences added to it. Node n stands
// for one string s; count(n) = how many times s occurred; its children are s's one-token
// extensions. Strings are added one token at a time (a running sequence grows by appending), and a
// whole sequence can be taken out again (a cached output evicted).
class SuffixTree {
 public:
  explicit SuffixTree(int max_depth);

  // A sequence being added token by token: the nodes of its strings that end at its last token.
  struct Cursor {
    std::vector<int32_t> open;  // nodes of depth < max_depth, the shortest string first
  };
  // Appends `token` to the sequence `cursor` follows: every string ending at the new token gets
  // count += delta (+1 to add, -1 to take out an earlier addition of the same sequence).
  void append(Cursor& cursor, int32_t token, int delta = 1);
  void add(std::span<const int32_t> tokens, int delta = 1);

  // How many times `s` occurred (0 for strings longer than max_depth or never seen).
  int count(std::span<const int32_t> s) const;
  int max_depth() const { return max_depth_; }
  size_t num_nodes() const { return nodes_.size(); }

  // The best draft that follows some suffix of `context`: for each suffix length m that occurs
  // (up to max_depth - 1), the greedy walk from its node (most frequent child first, the lower
  // token id on ties) while the product of child / (sum of the node's children) counts stays >=
  // min_prob and the draft is shorter than max_tokens and factor * m. Among them the draft with the
  // largest expected accepted length (sum of the running products) wins; the longer match on ties.
  struct Draft {
    std::vector<int32_t> tokens;
    double score = 0;  // expected number of accepted tokens under the tree's statistics
    int match_len = 0;
  };
  Draft speculate(std::span<const int32_t> context, int max_tokens, double max_spec_factor, double min_prob) const;

 private:
  struct Node {
    int32_t token = -1;
    int32_t count = 0;
    int32_t first_child = -1;
    int32_t next_sibling = -1;
  };
  int32_t child(int32_t node, int32_t token) const;
  int32_t child_or_new(int32_t node, int32_t token);

  int max_depth_;
  std::vector<Node> nodes_;                       // nodes_[0] is the root (the empty string)
  std::unordered_map<uint64_t, int32_t> lookup_;  // (parent << 32 | token) -> child
};

// The drafter: per-request trees (created at a request's first proposal, extended by the tokens
// it gained since) and one tree over the outputs of the last max_cached_requests finished ones.
class SuffixDrafter : public Drafter {
 public:
  explicit SuffixDrafter(const SpeculativeConfig& config);
  Draft propose(const DraftRequest& request) override;
  void finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) override;

  size_t num_tracked_requests() const { return requests_.size(); }
  size_t num_cached_outputs() const { return cached_.size(); }

 private:
  struct RequestTree {
    explicit RequestTree(int depth) : tree(depth) {}
    SuffixTree tree;
    SuffixTree::Cursor cursor;
    size_t consumed = 0;  // tokens of the sequence added so far
  };
  void rebuild_global();

  int max_depth_, max_cached_;
  double max_spec_factor_, min_token_prob_;
  std::unordered_map<uint64_t, RequestTree> requests_;
  SuffixTree global_;
  std::deque<std::vector<int32_t>> cached_;  // outputs in the global tree, oldest first
  size_t evicted_since_rebuild_ = 0;
};

}  // namespace ossrt
