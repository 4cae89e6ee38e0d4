// Tensor views: row arithmetic, including the empty views a step without logit rows makes.
#include <gtest/gtest.h>

#include <vector>

#include "core/tensor.h"

namespace ossrt {
namespace {

Tensor view_of(std::vector<float>& storage, std::initializer_list<int64_t> shape) {
  return Tensor(storage.data(), DType::F32, shape);
}

TEST(Tensor, RowElemsIsTheProductOfTheTrailingDimensions) {
  std::vector<float> storage(4 * 3 * 2);
  EXPECT_EQ(view_of(storage, {4, 3, 2}).row_elems(), 6);
  EXPECT_EQ(view_of(storage, {4, 3}).row_elems(), 3);
  EXPECT_EQ(view_of(storage, {24}).row_elems(), 1);
}

// A step whose sequences are all mid-prefill returns no logit rows: rows(0, 0) of the workspace,
// and then row_elems() of that [0, H] view (this divided by zero once, issue 7's engine GPU test).
TEST(Tensor, ZeroRowViewsKeepTheirRowWidth) {
  std::vector<float> storage(8 * 5);
  const Tensor all = view_of(storage, {8, 5});
  const Tensor none = all.rows(0, 0);
  EXPECT_EQ(none.shape[0], 0);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.row_elems(), 5);
  EXPECT_EQ(none.rows(0, 0).data, all.data);
  const Tensor tail = all.rows(6, 2);
  EXPECT_EQ(static_cast<const float*>(tail.data) - storage.data(), 30);
}

}  // namespace
}  // namespace ossrt
