// Pieces shared by the sharded embedding collections (pooled: sharded_embedding_bag_collection.h,
// unpooled: sharded_embedding_collection.h): the batch-size all-gather every forward starts with,
// the data_parallel tables' gradient sum, and row collectives whose tensors may live on another
// device than the group's.
//
// Devices: ids are routed on the host (they come from the data loader there) while the tables
// and their outputs may be on a GPU, and the group may be MPI (host tensors) or NCCL (device
// tensors). Every function here takes tensors on any device and returns its results on the
// input's device (all_reduce_row_grads: on the weights' device); a tensor on another device than
// the group's goes through a copy there and back. GPU tables over an MPI group thus exchange
// through host memory: correct, not fast (an NCCL group avoids the copies). On a 1-rank group of
// another device the collectives are the identity and are skipped (one GPU copies nothing).
//
// all_reduce_row_grads: the replicas' row-sparse gradients of replicated tables, summed over the
// group. The local gradients are densified into ONE flat buffer (every table's [rows, dim] block,
// then one touch count per row) and all-reduced (sum); the result lists, per table, the rows that
// any replica touched with their summed gradient (sorted by table; tables no replica touched are
// absent), so every replica steps the same rows alike. Fine for the small tables a planner
// replicates; a big replicated table moves its full size every step. Collective: every rank calls
// it with the same tables (an empty `grads` included).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/embedding_bag.h"

namespace mt::parallel {

// All-to-all of dim-0 rows with uneven splits (expert/token_exchange.h's all_to_all_rows).
Tensor exchange_rows(const std::shared_ptr<ProcessGroup>& group, const Tensor& x,
                     std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                     const std::string& name);
// in [size * rows, cols] -> this rank's row block [rows, cols], summed over the ranks.
Tensor reduce_scatter_rows(ProcessGroup& group, const Tensor& in, const std::string& name);
// in [rows, cols] -> every rank's block, [size * rows, cols] in rank order.
Tensor all_gather_rows(ProcessGroup& group, const Tensor& in, const std::string& name);

// The batch size of every rank (one all-gather).
std::vector<int64_t> all_gather_batch_sizes(ProcessGroup& group, int64_t batch,
                                            const std::string& name);

// See above. `weights`: the replicated tables (their shapes); grads[i].table indexes them.
std::vector<runtime::RowSparseGrad> all_reduce_row_grads(
    ProcessGroup& group, const std::vector<runtime::Tensor>& weights,
    const std::vector<runtime::RowSparseGrad>& grads, runtime::DType dtype,
    const std::string& name);

}  // namespace mt::parallel
