#include "structured/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::structured {

Vocabulary::Vocabulary(std::vector<std::string> bytes, std::vector<bool> ordinary)
    : bytes_(std::move(bytes)), ordinary_(std::move(ordinary)) {
  OSSRT_CHECK(bytes_.size() == ordinary_.size(), "vocabulary: {} byte strings but {} flags", bytes_.size(),
              ordinary_.size());
  const int32_t n = size();
  ordinary_mask_.assign(size_t(mask_words()), 0);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i) {
    if (bytes_[size_t(i)].empty()) ordinary_[size_t(i)] = false;
    if (!ordinary_[size_t(i)]) continue;
    ids.push_back(i);
    set_bit(ordinary_mask_, i);
    max_len_ = std::max(max_len_, int32_t(bytes_[size_t(i)].size()));
  }
  OSSRT_CHECK(max_len_ < 65536, "vocabulary: a token of {} bytes", max_len_);
  num_ordinary_ = int32_t(ids.size());
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });

  // Preorder trie from the sorted tokens: keep the path of open nodes; a token pops the path to
  // its common prefix with the previous token and pushes one node per new byte.
  std::vector<int32_t> path;  // node index at each depth - 1
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& t = bytes_[size_t(id)];
    size_t lcp = 0;
    if (prev) {
      const size_t m = std::min(prev->size(), t.size());
      while (lcp < m && (*prev)[lcp] == t[lcp]) ++lcp;
    }
    while (path.size() > lcp) {
      trie_[size_t(path.back())].end = int32_t(trie_.size());
      path.pop_back();
    }
    if (lcp == t.size()) {  // same bytes as the previous token
      duplicates_.emplace(path.back(), id);
    } else {
      for (size_t d = lcp; d < t.size(); ++d) {
        path.push_back(int32_t(trie_.size()));
        trie_.push_back(TrieNode{uint8_t(t[d]), uint16_t(d + 1), -1, -1});
      }
      trie_[size_t(path.back())].token = id;
    }
    by_bytes_.emplace(std::string_view(t), id);
    prev = &t;
  }
  while (!path.empty()) {
    trie_[size_t(path.back())].end = int32_t(trie_.size());
    path.pop_back();
  }
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<bool> ordinary(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    bytes[size_t(i)] = tokenizer.token_bytes(i);
    ordinary[size_t(i)] = !tokenizer.is_special(i);
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), std::move(ordinary));
}

std::optional<int32_t> Vocabulary::find(std::string_view b) const {
  auto it = by_bytes_.find(b);
  if (it == by_bytes_.end()) return std::nullopt;
  return it->second;
}

}  // namespace ossrt::structured
