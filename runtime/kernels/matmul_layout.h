// How a strided matrix maps onto a BLAS operand, shared by the CPU (OpenBLAS) and CUDA
// (cuBLASLt) matmul kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "runtime/core/shape.h"

namespace mt::runtime {

// A strided [rows, cols] row-major matrix as a BLAS operand: trans = false when rows are
// contiguous runs (ld = row stride), true for a transposed view (ld = column stride).
struct MatrixLayout {
  bool trans;
  int64_t ld;
};

// nullopt for layouts BLAS cannot read in place (broadcast, stepped slices, negative strides).
inline std::optional<MatrixLayout> matrix_layout(int64_t rows, int64_t cols, int64_t rs,
                                                 int64_t cs) {
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols)))
    return MatrixLayout{false, rows == 1 ? std::max<int64_t>(1, cols) : rs};
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows)))
    return MatrixLayout{true, cols == 1 ? std::max<int64_t>(1, rows) : cs};
  return std::nullopt;
}

// True when the batch dims (strides `bs`, broadcast to `batch`) and the M rows form one run of
// rows with stride `ld`: the whole batch is then a single [nb*M, K] operand.
inline bool batch_folds_into_rows(const Shape& batch, const Shape& bs, int64_t M, int64_t ld) {
  int64_t expect = ld * M;
  for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
    if (batch[d] == 1) continue;
    if (bs[d] != expect) return false;
    expect *= batch[d];
  }
  return true;
}

}  // namespace mt::runtime
