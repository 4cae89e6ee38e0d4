#include "engine/suffix_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

namespace {
uint64_t child_key(int32_t parent, int32_t token) { return (uint64_t(uint32_t(parent)) << 32) | uint32_t(token); }
}  // namespace

SuffixTree::SuffixTree(int max_depth) : max_depth_(max_depth) {
  OSSRT_CHECK(max_depth >= 1, "suffix tree: max_depth {} must be >= 1", max_depth);
  nodes_.emplace_back();
}

int32_t SuffixTree::child(int32_t node, int32_t token) const {
  const auto it = lookup_.find(child_key(node, token));
  return it == lookup_.end() ? -1 : it->second;
}

int32_t SuffixTree::child_or_new(int32_t node, int32_t token) {
  const auto [it, inserted] = lookup_.try_emplace(child_key(node, token), int32_t(nodes_.size()));
  if (inserted) {
    Node n;
    n.token = token;
    n.next_sibling = nodes_[size_t(node)].first_child;
    nodes_.push_back(n);
    nodes_[size_t(node)].first_child = it->second;
  }
  return it->second;
}

void SuffixTree::append(Cursor& cursor, int32_t token, int delta) {
  // The strings ending at the new token: the token alone, and each open string (ending at the
  // previous token; open[i] is i + 1 tokens long) extended by it. Those shorter than max_depth
  // stay open.
  std::vector<int32_t> next;
  next.reserve(cursor.open.size() + 1);
  auto extend = [&](int32_t parent, int depth) {
    const int32_t c = child_or_new(parent, token);
    nodes_[size_t(c)].count += delta;
    if (depth < max_depth_) next.push_back(c);
  };
  extend(0, 1);
  for (size_t i = 0; i < cursor.open.size(); ++i) extend(cursor.open[i], int(i) + 2);
  cursor.open = std::move(next);
}

int SuffixTree::count(std::span<const int32_t> s) const {
  if (s.empty() || int(s.size()) > max_depth_) return 0;
  int32_t node = 0;
  for (int32_t t : s)
    if ((node = child(node, t)) < 0) return 0;
  return nodes_[size_t(node)].count;
}

void SuffixTree::add(std::span<const int32_t> tokens, int delta) {
  Cursor cursor;
  for (int32_t t : tokens) append(cursor, t, delta);
}

SuffixTree::Draft SuffixTree::speculate(std::span<const int32_t> context, int max_tokens, double max_spec_factor,
                                        double min_prob) const {
  Draft best;
  if (max_tokens <= 0) return best;
  const int n = int(context.size());
  const int longest = std::min(n, max_depth_ - 1);  // a match of max_depth leaves no room to draft
  for (int m = 1; m <= longest; ++m) {
    // The node of the string context[n - m, n), if it occurred.
    int32_t node = 0;
    for (int i = n - m; i < n && node >= 0; ++i) {
      node = child(node, context[size_t(i)]);
      if (node >= 0 && nodes_[size_t(node)].count <= 0) node = -1;
    }
    if (node < 0) break;  // a longer suffix contains this one: it cannot occur either
    const int limit = std::min(max_tokens, int(max_spec_factor * m + 1e-9));
    Draft d;
    d.match_len = m;
    double p = 1.0;
    while (int(d.tokens.size()) < limit) {
      int64_t total = 0;
      int32_t pick = -1;
      for (int32_t c = nodes_[size_t(node)].first_child; c >= 0; c = nodes_[size_t(c)].next_sibling) {
        const Node& cn = nodes_[size_t(c)];
        if (cn.count <= 0) continue;
        total += cn.count;
        if (pick < 0 || cn.count > nodes_[size_t(pick)].count ||
            (cn.count == nodes_[size_t(pick)].count && cn.token < nodes_[size_t(pick)].token))
          pick = c;
      }
      if (pick < 0) break;
      p *= double(nodes_[size_t(pick)].count) / double(total);
      if (p < min_prob) break;
      d.tokens.push_back(nodes_[size_t(pick)].token);
      d.score += p;
      node = pick;
    }
    if (d.score >= best.score && !d.tokens.empty()) best = std::move(d);
  }
  return best;
}

SuffixDrafter::SuffixDrafter(const SpeculativeConfig& config)
    : max_depth_(config.suffix_max_tree_depth),
      max_cached_(config.suffix_max_cached_requests),
      max_spec_factor_(config.suffix_max_spec_factor),
      min_token_prob_(config.suffix_min_token_prob),
      global_(config.suffix_max_tree_depth) {
  OSSRT_CHECK(max_depth_ >= 2 && max_cached_ >= 0 && max_spec_factor_ > 0 && min_token_prob_ >= 0,
              "suffix drafter: invalid configuration");
}

Draft SuffixDrafter::propose(const DraftRequest& in) {
  const int max_tokens = in.max_tokens;
  if (max_tokens <= 0 || in.tokens.empty()) return {};
  auto it = requests_.try_emplace(in.sequence, max_depth_).first;
  RequestTree& r = it->second;
  if (in.tokens.size() < r.consumed) {  // not the sequence this tree was built for: start again
    r = RequestTree(max_depth_);
  }
  for (size_t i = r.consumed; i < in.tokens.size(); ++i) r.tree.append(r.cursor, in.tokens[i]);
  r.consumed = in.tokens.size();

  SuffixTree::Draft own = r.tree.speculate(in.tokens, max_tokens, max_spec_factor_, min_token_prob_);
  SuffixTree::Draft shared = global_.speculate(in.tokens, max_tokens, max_spec_factor_, min_token_prob_);
  // Point-mass guesses (Draft::probs empty): the tree's statistics are not a distribution the
  // guesses were drawn from.
  return Draft{std::move(shared.score > own.score ? shared : own).tokens, {}};
}

void SuffixDrafter::finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) {
  requests_.erase(sequence);
  if (max_cached_ == 0 || int(tokens.size()) <= prompt_len) return;
  cached_.emplace_back(tokens.begin() + prompt_len, tokens.end());
  global_.add(cached_.back());
  while (int(cached_.size()) > max_cached_) {
    global_.add(cached_.front(), -1);  // its counts go; its nodes stay (count 0) until a rebuild
    cached_.pop_front();
    ++evicted_since_rebuild_;
  }
  // Rebuild once as many outputs were evicted as are cached: the tree's dead nodes stay at most
  // about as many as its live ones.
  if (evicted_since_rebuild_ > 0 && evicted_since_rebuild_ >= cached_.size()) rebuild_global();
}

void SuffixDrafter::rebuild_global() {
  global_ = SuffixTree(max_depth_);
  for (const auto& out : cached_) global_.add(out);
  evicted_since_rebuild_ = 0;
}

}  // namespace ossrt
