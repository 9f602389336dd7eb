// Kernel tables of the table-batched embedding family (the ops are runtime/ops/embedding_bag.h).
//
// TbePlan is the resolved host layout: F features, batch B, per feature its table, whether it
// pools by MEAN, and where its output starts (pooled: a column of the [B, out_width] output;
// unpooled: an element offset of the flat output). Operands: tables contiguous [rows_t, dim_t]
// of one dtype; values i64 [N] and offsets i64 [F*B + 1] contiguous (offsets already validated:
// start at 0, non-decreasing, end at N); weights contiguous [N] of the compute dtype (f64 for f64
// tables, else f32) or undefined.
//
// tbe_forward_kernel -> int64_t: fills out (pooled: [B, out_width]; unpooled: flat). Values,
//   offsets and weights on the tables' device. An id outside its table is skipped (never read);
//   the CPU kernel returns the value position of the first such id (out is then unspecified),
//   else -1. The CUDA kernel returns -1 without looking: the op checks the ids of device tables
//   on the host before the launch, so that the host never waits for the device's verdict.
// tbe_backward_kernel: grad_out shaped like out, on the tables' device; values, offsets and
//   weights on the HOST (the grouping by row reads them there, so a device backend needs no
//   copy back). Returns one RowSparseGrad per table the batch touched (ascending table), rows
//   sorted, each row's contributions summed in increasing value position (in the compute
//   dtype), so results do not depend on the thread count; rows and values on the tables' device.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/dispatch.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/embedding_bag.h"

namespace mt::runtime {

struct TbePlan {
  int64_t batch_size = 0;
  bool pooled = true;
  int64_t out_width = 0;               // pooled: sum of the features' dims
  std::vector<int64_t> feature_table;  // [F]
  std::vector<uint8_t> feature_mean;   // [F]: 1 when MEAN pooling
  std::vector<int64_t> feature_out;    // [F]: output column (pooled) or flat element offset
};

inline constinit KernelTable<int64_t(const std::vector<Tensor>& tables, const Tensor& values,
                                     const Tensor& offsets, const Tensor& weights,
                                     const TbePlan& plan, Tensor& out)>
    tbe_forward_kernel{"embedding_bags_batched"};

inline constinit KernelTable<std::vector<RowSparseGrad>(
    const std::vector<Tensor>& tables, const Tensor& values, const Tensor& offsets,
    const Tensor& weights, const TbePlan& plan, const Tensor& grad_out)>
    tbe_backward_kernel{"embedding_bags_batched_backward"};

}  // namespace mt::runtime
