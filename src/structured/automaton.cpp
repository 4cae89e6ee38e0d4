#include "structured/automaton.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "structured/error.h"

namespace ossrt::structured {

namespace {

using ClassSet = std::bitset<256>;  // a set of byte classes (there are at most 256)

// Thompson NFA of one rule body: epsilon edges, byte-class edges and call edges.
struct NfaState {
  std::vector<int32_t> eps;
  std::vector<std::pair<ClassSet, int32_t>> bytes;
  std::vector<CallEdge> calls;
};

struct Nfa {
  std::vector<NfaState> states;
  int32_t add() {
    if (states.size() >= size_t(kMaxNfaStates))
      throw StructuredError("", fmt::format("the grammar is too large (more than {} automaton states before "
                                            "minimisation); lower repetition bounds such as maxItems or maxLength",
                                            kMaxNfaStates));
    states.emplace_back();
    return int32_t(states.size() - 1);
  }
};

// The DFA of one rule before it joins the automaton; state 0 is the start.
struct RuleDfa {
  int32_t classes = 0;
  std::vector<int32_t> trans;  // [state][class], -1 = none
  std::vector<uint8_t> accept;
  std::vector<std::vector<CallEdge>> calls;
  int32_t size() const { return int32_t(accept.size()); }
  int32_t add() {
    accept.push_back(0);
    calls.emplace_back();
    trans.resize(trans.size() + size_t(classes), -1);
    return size() - 1;
  }
  int32_t& at(int32_t s, int32_t c) { return trans[size_t(s) * size_t(classes) + size_t(c)]; }
  int32_t at(int32_t s, int32_t c) const { return trans[size_t(s) * size_t(classes) + size_t(c)]; }
};

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ v.size();
    for (int32_t x : v) h = (h ^ uint64_t(uint32_t(x))) * 0x100000001b3ull;
    return size_t(h);
  }
};

}  // namespace

class AutomatonBuilder {
 public:
  explicit AutomatonBuilder(const Grammar& g) : g_(g) {}

  Automaton build() {
    if (g_.root() < 0) throw StructuredError("", "the grammar has no root rule");
    for (int32_t r = 0; r < g_.num_rules(); ++r)
      if (g_.rule(r).body < 0)
        throw StructuredError("", fmt::format("rule '{}' is used but not defined", g_.rule(r).name));
    compute_classes();
    choose_call_rules();
    std::vector<RuleDfa> dfas;
    for (int32_t gr : kept_) {
      Nfa nfa;
      const int32_t start = nfa.add();
      const int32_t end = nfa.add();
      auto [s, e] = thompson(nfa, g_.rule(gr).body, 0);
      nfa.states[size_t(start)].eps.push_back(s);
      nfa.states[size_t(e)].eps.push_back(end);
      dfas.push_back(determinize(nfa, start, end, true));
    }
    trim(dfas);
    for (RuleDfa& d : dfas) d = minimize(d);
    Automaton a = assemble(dfas);
    check_left_recursion(a);
    return a;
  }

 private:
  void compute_classes() {
    // Partition the bytes into classes that no byte set of the grammar separates.
    std::unordered_set<ByteSet> sets;
    for (int32_t i = 0; i < g_.num_nodes(); ++i)
      if (g_.node(i).kind == NodeKind::Bytes) sets.insert(g_.node(i).bytes);
    std::array<int32_t, 256> cls{};
    int32_t n = 1;
    for (const ByteSet& s : sets) {
      std::map<std::pair<int32_t, bool>, int32_t> remap;
      std::array<int32_t, 256> next{};
      for (int b = 0; b < 256; ++b) {
        auto key = std::make_pair(cls[size_t(b)], bool(s.test(size_t(b))));
        auto it = remap.find(key);
        if (it == remap.end()) it = remap.emplace(key, int32_t(remap.size())).first;
        next[size_t(b)] = it->second;
      }
      cls = next;
      n = int32_t(remap.size());
    }
    num_classes_ = n;
    class_rep_.assign(size_t(n), -1);
    for (int b = 0; b < 256; ++b) {
      byte_class_[size_t(b)] = uint8_t(cls[size_t(b)]);
      if (class_rep_[size_t(cls[size_t(b)])] < 0) class_rep_[size_t(cls[size_t(b)])] = b;
    }
  }

  ClassSet classes_of(const ByteSet& s) const {
    ClassSet out;
    for (int32_t c = 0; c < num_classes_; ++c)
      if (s.test(size_t(class_rep_[size_t(c)]))) out.set(size_t(c));
    return out;
  }

  // Rules referenced from `node`, once per copy the automaton will make: a reference inside a
  // repetition {m,n} is expanded n times, so it counts n times (m + 1 when unbounded).
  void collect_refs(int32_t node, int64_t copies, std::vector<int32_t>& out, std::vector<int64_t>& uses) const {
    const Node& n = g_.node(node);
    if (n.kind == NodeKind::Ref) {
      out.push_back(n.rule);
      uses[size_t(n.rule)] += copies;
    }
    int64_t inner = copies;
    if (n.kind == NodeKind::Repeat)
      inner = std::min<int64_t>(copies * std::max(1, n.max == kUnbounded ? n.min + 1 : n.max), 1 << 30);
    for (int32_t c : n.children) collect_refs(c, inner, out, uses);
  }

  // Which rules stay calls: recursive ones (they must), shared ones the grammar marked, the root,
  // and rules referenced from several places that are not tiny (inlining them everywhere would
  // multiply states and precomputed masks).
  void choose_call_rules() {
    const int32_t n = g_.num_rules();
    std::vector<std::vector<int32_t>> refs(static_cast<size_t>(n));
    std::vector<int64_t> uses(size_t(n), 0);
    std::vector<int32_t> body_size(size_t(n), 0);
    for (int32_t r = 0; r < n; ++r) {
      collect_refs(g_.rule(r).body, 1, refs[size_t(r)], uses);
      std::vector<int32_t> stack{g_.rule(r).body};
      while (!stack.empty() && body_size[size_t(r)] < 100000) {  // shared subtrees: stop counting early
        const Node& nd = g_.node(stack.back());
        stack.pop_back();
        ++body_size[size_t(r)];
        for (int32_t c : nd.children) stack.push_back(c);
      }
    }
    // Tarjan's SCCs (iterative) to find recursive rules.
    std::vector<int32_t> index(size_t(n), -1), low(size_t(n), 0), comp(size_t(n), -1), comp_size;
    std::vector<bool> on_stack(size_t(n), false);
    std::vector<int32_t> stack;
    int32_t counter = 0;
    for (int32_t root = 0; root < n; ++root) {
      if (index[size_t(root)] >= 0) continue;
      std::vector<std::pair<int32_t, size_t>> work{{root, 0}};
      while (!work.empty()) {
        auto& [v, i] = work.back();
        if (i == 0 && index[size_t(v)] < 0) {
          index[size_t(v)] = low[size_t(v)] = counter++;
          stack.push_back(v);
          on_stack[size_t(v)] = true;
        }
        if (i < refs[size_t(v)].size()) {
          const int32_t w = refs[size_t(v)][i++];
          if (index[size_t(w)] < 0) {
            work.push_back({w, 0});
          } else if (on_stack[size_t(w)]) {
            low[size_t(v)] = std::min(low[size_t(v)], index[size_t(w)]);
          }
          continue;
        }
        if (low[size_t(v)] == index[size_t(v)]) {
          const int32_t id = int32_t(comp_size.size());
          comp_size.push_back(0);
          for (;;) {
            const int32_t w = stack.back();
            stack.pop_back();
            on_stack[size_t(w)] = false;
            comp[size_t(w)] = id;
            ++comp_size.back();
            if (w == v) break;
          }
        }
        const int32_t done = v;
        work.pop_back();
        if (!work.empty()) low[size_t(work.back().first)] = std::min(low[size_t(work.back().first)], low[size_t(done)]);
      }
    }
    call_id_.assign(size_t(n), -1);
    auto keep = [&](int32_t r) {
      if (call_id_[size_t(r)] >= 0) return;
      call_id_[size_t(r)] = int32_t(kept_.size());
      kept_.push_back(r);
    };
    keep(g_.root());
    for (int32_t r = 0; r < n; ++r) {
      const bool self_ref = std::find(refs[size_t(r)].begin(), refs[size_t(r)].end(), r) != refs[size_t(r)].end();
      const bool recursive = comp_size[size_t(comp[size_t(r)])] > 1 || self_ref;
      const bool shared_and_big = uses[size_t(r)] > 1 && body_size[size_t(r)] > 24;
      if (recursive || !g_.rule(r).inline_ok || shared_and_big) keep(r);
    }
  }

  // Builds node into nfa; returns (entry, exit) states.
  std::pair<int32_t, int32_t> thompson(Nfa& nfa, int32_t id, int depth) {
    if (depth > 2000) throw StructuredError("", "the grammar nests too deeply (more than 2000 levels)");
    const Node& n = g_.node(id);
    const int32_t s = nfa.add();
    switch (n.kind) {
      case NodeKind::Empty: return {s, s};
      case NodeKind::Bytes: {
        const int32_t e = nfa.add();
        nfa.states[size_t(s)].bytes.push_back({classes_of(n.bytes), e});
        return {s, e};
      }
      case NodeKind::Seq: {
        int32_t cur = s;
        for (int32_t c : n.children) {
          auto [cs, ce] = thompson(nfa, c, depth + 1);
          nfa.states[size_t(cur)].eps.push_back(cs);
          cur = ce;
        }
        return {s, cur};
      }
      case NodeKind::Alt: {
        const int32_t e = nfa.add();
        for (int32_t c : n.children) {
          auto [cs, ce] = thompson(nfa, c, depth + 1);
          nfa.states[size_t(s)].eps.push_back(cs);
          nfa.states[size_t(ce)].eps.push_back(e);
        }
        return {s, e};
      }
      case NodeKind::Repeat: {
        int32_t cur = s;
        for (int32_t i = 0; i < n.min; ++i) {
          auto [cs, ce] = thompson(nfa, n.children[0], depth + 1);
          nfa.states[size_t(cur)].eps.push_back(cs);
          cur = ce;
        }
        const int32_t e = nfa.add();
        if (n.max == kUnbounded) {
          auto [cs, ce] = thompson(nfa, n.children[0], depth + 1);
          nfa.states[size_t(cur)].eps.push_back(cs);
          nfa.states[size_t(ce)].eps.push_back(cur);
          nfa.states[size_t(cur)].eps.push_back(e);
        } else {
          for (int32_t i = n.min; i < n.max; ++i) {
            nfa.states[size_t(cur)].eps.push_back(e);  // stop here
            auto [cs, ce] = thompson(nfa, n.children[0], depth + 1);
            nfa.states[size_t(cur)].eps.push_back(cs);
            cur = ce;
          }
          nfa.states[size_t(cur)].eps.push_back(e);
        }
        return {s, e};
      }
      case NodeKind::Ref: {
        const int32_t callee = call_id_[size_t(n.rule)];
        if (callee < 0) {  // inlined: not recursive, so this terminates
          auto [cs, ce] = thompson(nfa, g_.rule(n.rule).body, depth + 1);
          nfa.states[size_t(s)].eps.push_back(cs);
          return {s, ce};
        }
        const int32_t e = nfa.add();
        nfa.states[size_t(s)].calls.push_back({callee, e});
        return {s, e};
      }
      case NodeKind::Intersect: {
        RuleDfa parts[2];
        for (int k = 0; k < 2; ++k) {
          Nfa sub;
          const int32_t ss = sub.add();
          const int32_t se = sub.add();
          auto [cs, ce] = thompson(sub, n.children[size_t(k)], depth + 1);
          sub.states[size_t(ss)].eps.push_back(cs);
          sub.states[size_t(ce)].eps.push_back(se);
          parts[k] = determinize(sub, ss, se, false);
        }
        const RuleDfa both = product(parts[0], parts[1]);
        // Embed the product DFA: one NFA state per DFA state, accepting states lead to the exit.
        const int32_t base = int32_t(nfa.states.size());
        for (int32_t i = 0; i < both.size(); ++i) nfa.add();
        const int32_t e = nfa.add();
        nfa.states[size_t(s)].eps.push_back(base);
        for (int32_t i = 0; i < both.size(); ++i) {
          std::map<int32_t, ClassSet> by_target;
          for (int32_t c = 0; c < num_classes_; ++c)
            if (both.at(i, c) >= 0) by_target[both.at(i, c)].set(size_t(c));
          for (auto& [t, cs] : by_target) nfa.states[size_t(base + i)].bytes.push_back({cs, base + t});
          if (both.accept[size_t(i)]) nfa.states[size_t(base + i)].eps.push_back(e);
        }
        return {s, e};
      }
    }
    return {s, s};
  }

  static void eps_closure(const Nfa& nfa, std::vector<int32_t>& set, std::vector<uint32_t>& mark, uint32_t stamp) {
    std::vector<int32_t> work(set.begin(), set.end());
    set.clear();
    while (!work.empty()) {
      const int32_t x = work.back();
      work.pop_back();
      if (mark[size_t(x)] == stamp) continue;
      mark[size_t(x)] = stamp;
      set.push_back(x);
      for (int32_t y : nfa.states[size_t(x)].eps) work.push_back(y);
    }
    std::sort(set.begin(), set.end());
  }

  void count_dfa_state() {
    if (++total_dfa_states_ > kMaxDfaStates)
      throw StructuredError("",
                            fmt::format("the grammar is too complex (more than {} automaton states)", kMaxDfaStates));
  }

  // Subset construction over byte classes and call symbols.
  RuleDfa determinize(const Nfa& nfa, int32_t start, int32_t end, bool allow_calls) {
    RuleDfa d;
    d.classes = num_classes_;
    std::vector<uint32_t> mark(nfa.states.size(), 0);
    uint32_t stamp = 0;
    std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
    std::vector<std::vector<int32_t>> sets;
    auto intern = [&](std::vector<int32_t> set) -> int32_t {
      eps_closure(nfa, set, mark, ++stamp);
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      count_dfa_state();
      const int32_t id = d.add();
      ids.emplace(set, id);
      sets.push_back(std::move(set));
      return id;
    };
    intern({start});
    std::vector<std::vector<int32_t>> by_class(static_cast<size_t>(num_classes_));
    for (int32_t i = 0; i < d.size(); ++i) {
      const std::vector<int32_t> set = sets[size_t(i)];
      // Subset construction can be quadratic in the NFA (large sets times many states) before the
      // state bound is reached; bound the work itself so a hostile grammar fails in about a second.
      subset_work_ += int64_t(set.size()) * (num_classes_ + 1);
      if (subset_work_ > kMaxSubsetWork)
        throw StructuredError("", "the grammar is too complex to compile (its automaton grows too large)");
      for (auto& b : by_class) b.clear();
      std::map<int32_t, std::vector<int32_t>> by_rule;
      bool accept = false;
      for (int32_t x : set) {
        if (x == end) accept = true;
        const NfaState& st = nfa.states[size_t(x)];
        for (const auto& [cs, t] : st.bytes)
          for (int32_t c = 0; c < num_classes_; ++c)
            if (cs.test(size_t(c))) by_class[size_t(c)].push_back(t);
        for (const CallEdge& ce : st.calls) {
          if (!allow_calls)
            throw StructuredError("",
                                  "an intersection ('&', or a string pattern combined with a format or length) "
                                  "needs regular operands, without recursive rules");
          by_rule[ce.rule].push_back(ce.ret);
        }
      }
      d.accept[size_t(i)] = accept;
      for (int32_t c = 0; c < num_classes_; ++c)
        if (!by_class[size_t(c)].empty()) {
          const int32_t t = intern(by_class[size_t(c)]);
          d.at(i, c) = t;
        }
      for (auto& [r, targets] : by_rule) {
        const int32_t t = intern(targets);
        d.calls[size_t(i)].push_back({r, t});
      }
    }
    return d;
  }

  RuleDfa product(const RuleDfa& a, const RuleDfa& b) {
    RuleDfa d;
    d.classes = num_classes_;
    std::map<std::pair<int32_t, int32_t>, int32_t> ids;
    std::vector<std::pair<int32_t, int32_t>> pairs;
    auto intern = [&](int32_t x, int32_t y) {
      auto it = ids.find({x, y});
      if (it != ids.end()) return it->second;
      count_dfa_state();
      const int32_t id = d.add();
      ids.emplace(std::make_pair(x, y), id);
      pairs.push_back({x, y});
      return id;
    };
    intern(0, 0);
    for (int32_t i = 0; i < d.size(); ++i) {
      const auto [x, y] = pairs[size_t(i)];
      d.accept[size_t(i)] = a.accept[size_t(x)] && b.accept[size_t(y)];
      for (int32_t c = 0; c < num_classes_; ++c) {
        const int32_t tx = a.at(x, c), ty = b.at(y, c);
        if (tx >= 0 && ty >= 0) {
          const int32_t t = intern(tx, ty);
          d.at(i, c) = t;
        }
      }
    }
    return d;
  }

  // Removes states that cannot reach the end of their rule (a call counts only when its rule can
  // complete), then calls into rules that accept nothing. Fails when the root accepts nothing.
  void trim(std::vector<RuleDfa>& dfas) {
    std::vector<std::vector<uint8_t>> live(dfas.size());
    for (size_t r = 0; r < dfas.size(); ++r) live[r].assign(size_t(dfas[r].size()), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < dfas.size(); ++r) {
        const RuleDfa& d = dfas[r];
        for (int32_t s = 0; s < d.size(); ++s) {
          if (live[r][size_t(s)]) continue;
          bool ok = d.accept[size_t(s)];
          for (int32_t c = 0; !ok && c < d.classes; ++c) ok = d.at(s, c) >= 0 && live[r][size_t(d.at(s, c))];
          for (const CallEdge& ce : d.calls[size_t(s)])
            ok = ok || (live[size_t(ce.rule)][0] && live[r][size_t(ce.ret)]);
          if (ok) {
            live[r][size_t(s)] = 1;
            changed = true;
          }
        }
      }
    }
    if (!live[0][0]) throw StructuredError("", "the grammar matches nothing (no string satisfies it)");
    for (size_t r = 0; r < dfas.size(); ++r) {
      RuleDfa& d = dfas[r];
      for (int32_t s = 0; s < d.size(); ++s) {
        for (int32_t c = 0; c < d.classes; ++c)
          if (d.at(s, c) >= 0 && !live[r][size_t(d.at(s, c))]) d.at(s, c) = -1;
        auto& calls = d.calls[size_t(s)];
        calls.erase(
            std::remove_if(calls.begin(), calls.end(),
                           [&](const CallEdge& ce) { return !live[size_t(ce.rule)][0] || !live[r][size_t(ce.ret)]; }),
            calls.end());
      }
    }
  }

  // Drops unreachable states, then merges equivalent ones with Hopcroft's partition refinement
  // (O(|symbols| n log n); Moore's simpler refinement needs a round per state on the long chains
  // that repetition bounds build, which made large maxItems take minutes). Symbols are the byte
  // classes plus one per called rule; a missing transition goes to an explicit dead state.
  RuleDfa minimize(const RuleDfa& in) {
    std::vector<int32_t> order{0}, pos(size_t(in.size()), -1);
    pos[0] = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const int32_t s = order[i];
      auto visit = [&](int32_t t) {
        if (t >= 0 && pos[size_t(t)] < 0) {
          pos[size_t(t)] = int32_t(order.size());
          order.push_back(t);
        }
      };
      for (int32_t c = 0; c < in.classes; ++c) visit(in.at(s, c));
      for (const CallEdge& ce : in.calls[size_t(s)]) visit(ce.ret);
    }
    const int32_t n = int32_t(order.size());
    const int32_t dead = n;  // the sink
    const int32_t total = n + 1;
    // Symbols: classes, then one per called rule.
    std::map<int32_t, int32_t> rule_symbol;
    for (int32_t i = 0; i < n; ++i)
      for (const CallEdge& ce : in.calls[size_t(order[size_t(i)])])
        rule_symbol.emplace(ce.rule, int32_t(in.classes + rule_symbol.size()));
    const int32_t num_symbols = in.classes + int32_t(rule_symbol.size());
    // delta[s * num_symbols + a] in the compact numbering (dead for missing).
    std::vector<int32_t> delta(size_t(total) * size_t(num_symbols), dead);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t s = order[size_t(i)];
      for (int32_t c = 0; c < in.classes; ++c) {
        const int32_t t = in.at(s, c);
        if (t >= 0) delta[size_t(i) * size_t(num_symbols) + size_t(c)] = pos[size_t(t)];
      }
      for (const CallEdge& ce : in.calls[size_t(s)])
        delta[size_t(i) * size_t(num_symbols) + size_t(rule_symbol[ce.rule])] = pos[size_t(ce.ret)];
    }
    // Inverse transitions, CSR per (symbol, target).
    std::vector<int32_t> inv_begin(size_t(num_symbols) * size_t(total) + 1, 0), inv;
    for (int32_t s = 0; s < total; ++s)
      for (int32_t a = 0; a < num_symbols; ++a)
        ++inv_begin[size_t(a) * size_t(total) + size_t(delta[size_t(s) * size_t(num_symbols) + size_t(a)]) + 1];
    for (size_t k = 1; k < inv_begin.size(); ++k) inv_begin[k] += inv_begin[k - 1];
    inv.resize(size_t(inv_begin.back()));
    {
      std::vector<int32_t> fill(inv_begin.begin(), inv_begin.end() - 1);
      for (int32_t s = 0; s < total; ++s)
        for (int32_t a = 0; a < num_symbols; ++a)
          inv[size_t(fill[size_t(a) * size_t(total) + size_t(delta[size_t(s) * size_t(num_symbols) + size_t(a)])]++)] =
              s;
    }
    // Partition: elems ordered by block; block b covers [first[b], end[b]).
    std::vector<int32_t> elems(static_cast<size_t>(total)), where(static_cast<size_t>(total)),
        block(static_cast<size_t>(total));
    std::vector<int32_t> first, end, marked;
    {
      int32_t k = 0;
      for (int pass = 0; pass < 2; ++pass) {
        const int32_t b = int32_t(first.size());
        first.push_back(k);
        for (int32_t s = 0; s < total; ++s) {
          const bool acc = s < n && in.accept[size_t(order[size_t(s)])];
          if (acc == (pass == 0)) {
            elems[size_t(k)] = s;
            where[size_t(s)] = k++;
            block[size_t(s)] = b;
          }
        }
        end.push_back(k);
        if (end.back() == first.back()) {  // an empty block: drop it
          first.pop_back();
          end.pop_back();
        }
      }
      // Re-label blocks after a possible drop.
      for (int32_t b = 0; b < int32_t(first.size()); ++b)
        for (int32_t k2 = first[size_t(b)]; k2 < end[size_t(b)]; ++k2) block[size_t(elems[size_t(k2)])] = b;
    }
    marked.assign(first.size(), 0);
    std::vector<uint8_t> in_work(first.size(), 1);
    std::vector<int32_t> work;
    for (int32_t b = 0; b < int32_t(first.size()); ++b) work.push_back(b);
    std::vector<int32_t> touched, splitter;
    while (!work.empty()) {
      const int32_t a_block = work.back();
      work.pop_back();
      in_work[size_t(a_block)] = 0;
      splitter.assign(elems.begin() + first[size_t(a_block)], elems.begin() + end[size_t(a_block)]);
      for (int32_t a = 0; a < num_symbols; ++a) {
        touched.clear();
        for (int32_t t : splitter) {
          const size_t base = size_t(a) * size_t(total) + size_t(t);
          for (int32_t k = inv_begin[base]; k < inv_begin[base + 1]; ++k) {
            const int32_t s = inv[size_t(k)];
            const int32_t b = block[size_t(s)];
            const int32_t m = first[size_t(b)] + marked[size_t(b)];
            if (where[size_t(s)] < m) continue;  // already marked
            if (marked[size_t(b)] == 0) touched.push_back(b);
            // swap s to the marked front of its block
            const int32_t other = elems[size_t(m)];
            std::swap(elems[size_t(m)], elems[size_t(where[size_t(s)])]);
            where[size_t(other)] = where[size_t(s)];
            where[size_t(s)] = m;
            ++marked[size_t(b)];
          }
        }
        for (int32_t b : touched) {
          const int32_t size = end[size_t(b)] - first[size_t(b)];
          const int32_t m = marked[size_t(b)];
          marked[size_t(b)] = 0;
          if (m == size) continue;
          // The marked part [first, first + m) becomes a new block.
          const int32_t nb = int32_t(first.size());
          first.push_back(first[size_t(b)]);
          end.push_back(first[size_t(b)] + m);
          marked.push_back(0);
          in_work.push_back(0);
          first[size_t(b)] += m;
          for (int32_t k = first[size_t(nb)]; k < end[size_t(nb)]; ++k) block[size_t(elems[size_t(k)])] = nb;
          if (in_work[size_t(b)]) {
            work.push_back(nb);
            in_work[size_t(nb)] = 1;
          } else {
            const int32_t add = m <= size - m ? nb : b;
            work.push_back(add);
            in_work[size_t(add)] = 1;
          }
        }
      }
    }
    // Renumber blocks in order of first appearance so that the start state's block is 0; the
    // dead state's block is dropped (transitions into it become -1).
    const int32_t dead_block = block[size_t(dead)];
    std::vector<int32_t> renum(first.size(), -1);
    int32_t next_id = 0;
    for (int32_t i = 0; i < n; ++i)
      if (block[size_t(i)] != dead_block && renum[size_t(block[size_t(i)])] < 0)
        renum[size_t(block[size_t(i)])] = next_id++;
    RuleDfa out;
    out.classes = in.classes;
    for (int32_t i = 0; i < next_id; ++i) out.add();
    std::vector<uint8_t> done(size_t(next_id), 0);
    for (int32_t i = 0; i < n; ++i) {
      if (block[size_t(i)] == dead_block) continue;
      const int32_t b = renum[size_t(block[size_t(i)])];
      if (done[size_t(b)]) continue;
      done[size_t(b)] = 1;
      const int32_t s = order[size_t(i)];
      out.accept[size_t(b)] = in.accept[size_t(s)];
      auto target = [&](int32_t t) {
        const int32_t tb = block[size_t(pos[size_t(t)])];
        return tb == dead_block ? -1 : renum[size_t(tb)];
      };
      for (int32_t c = 0; c < in.classes; ++c) {
        const int32_t t = in.at(s, c);
        if (t >= 0) out.at(b, c) = target(t);
      }
      for (const CallEdge& ce : in.calls[size_t(s)]) {
        const int32_t t = target(ce.ret);
        if (t >= 0) out.calls[size_t(b)].push_back({ce.rule, t});
      }
    }
    return out;
  }

  Automaton assemble(const std::vector<RuleDfa>& dfas) {
    Automaton a;
    a.num_classes_ = num_classes_;
    a.byte_class_ = byte_class_;
    // A rule whose language is empty (it can never finish, e.g. `kv ::= "a" kv`) has a DFA of no
    // states; it gets one dead state (not accepting, no transitions, no calls), so its start is a
    // real state that matches nothing instead of the next rule's first state or one past the end.
    int32_t base = 0;
    for (size_t r = 0; r < dfas.size(); ++r) {
      a.rule_start_.push_back(base);
      a.rule_names_.push_back(g_.rule(kept_[r]).name);
      base += std::max<int32_t>(dfas[r].size(), 1);
    }
    a.root_rule_ = 0;
    a.call_begin_.push_back(0);
    for (size_t r = 0; r < dfas.size(); ++r) {
      const RuleDfa& d = dfas[r];
      const int32_t off = a.rule_start_[r];
      if (d.size() == 0) {
        a.trans_.insert(a.trans_.end(), size_t(num_classes_), -1);
        a.call_begin_.push_back(int32_t(a.calls_.size()));
        a.flags_.push_back(0);
        a.state_rule_.push_back(int32_t(r));
        continue;
      }
      for (int32_t s = 0; s < d.size(); ++s) {
        uint8_t f = d.accept[size_t(s)] ? kAccepting : 0;
        for (int32_t c = 0; c < d.classes; ++c) {
          const int32_t t = d.at(s, c);
          a.trans_.push_back(t < 0 ? -1 : t + off);
          if (t >= 0) f |= kHasBytes;
        }
        for (const CallEdge& ce : d.calls[size_t(s)]) a.calls_.push_back({ce.rule, ce.ret + off});
        if (!d.calls[size_t(s)].empty()) f |= kHasCalls;
        a.call_begin_.push_back(int32_t(a.calls_.size()));
        a.flags_.push_back(f);
        a.state_rule_.push_back(int32_t(r));
      }
    }
    return a;
  }

  // A rule that can reach itself through calls made before any byte is consumed would make the
  // matcher's closure push forever; refuse it with the cycle spelled out.
  static void check_left_recursion(const Automaton& a) {
    const int32_t nr = a.num_rules();
    std::vector<uint8_t> nullable(size_t(nr), 0);
    // States reachable from a rule's start without consuming bytes, given the nullable set so far.
    auto epsilon_reach = [&](int32_t r, const std::function<void(int32_t)>& visit) {
      std::vector<int32_t> work{a.rule_start(r)};
      std::unordered_set<int32_t> seen{a.rule_start(r)};
      while (!work.empty()) {
        const int32_t s = work.back();
        work.pop_back();
        visit(s);
        for (const CallEdge& ce : a.calls(s))
          if (nullable[size_t(ce.rule)] && seen.insert(ce.ret).second) work.push_back(ce.ret);
      }
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (int32_t r = 0; r < nr; ++r) {
        if (nullable[size_t(r)]) continue;
        bool acc = false;
        epsilon_reach(r, [&](int32_t s) { acc = acc || a.accepting(s); });
        if (acc) nullable[size_t(r)] = 1, changed = true;
      }
    }
    std::vector<std::vector<int32_t>> left(static_cast<size_t>(nr));
    for (int32_t r = 0; r < nr; ++r)
      epsilon_reach(r, [&](int32_t s) {
        for (const CallEdge& ce : a.calls(s)) left[size_t(r)].push_back(ce.rule);
      });
    std::vector<int32_t> color(size_t(nr), 0), path;
    std::function<void(int32_t)> dfs = [&](int32_t r) {
      color[size_t(r)] = 1;
      path.push_back(r);
      for (int32_t q : left[size_t(r)]) {
        if (color[size_t(q)] == 1) {
          std::string cycle;
          auto it = std::find(path.begin(), path.end(), q);
          for (; it != path.end(); ++it) cycle += a.rule_name(*it) + " -> ";
          throw StructuredError("", fmt::format("left recursion is not supported: {}{}", cycle, a.rule_name(q)));
        }
        if (color[size_t(q)] == 0) dfs(q);
      }
      path.pop_back();
      color[size_t(r)] = 2;
    };
    for (int32_t r = 0; r < nr; ++r)
      if (color[size_t(r)] == 0) dfs(r);
  }

  const Grammar& g_;
  int32_t num_classes_ = 1;
  std::array<uint8_t, 256> byte_class_{};
  std::vector<int32_t> class_rep_;
  std::vector<int32_t> call_id_;  // grammar rule -> automaton rule, -1 when inlined
  std::vector<int32_t> kept_;     // automaton rule -> grammar rule
  int64_t total_dfa_states_ = 0;
  int64_t subset_work_ = 0;
  static constexpr int64_t kMaxSubsetWork = 400'000'000;
};

Automaton Automaton::build(const Grammar& grammar) { return AutomatonBuilder(grammar).build(); }

std::string Automaton::describe() const {
  return fmt::format("{} states, {} rules, {} byte classes", num_states(), num_rules(), num_classes_);
}

}  // namespace ossrt::structured
