// Pieces shared by the sharded embedding collections (pooled: sharded_embedding_bag_collection.h,
// unpooled: sharded_embedding_collection.h): the batch-size all-gather every forward starts with,
// and the data_parallel tables' gradient sum.
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
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "runtime/core/tensor.h"
#include "runtime/ops/embedding_bag.h"

namespace mt::parallel {

// The batch size of every rank (one all-gather).
std::vector<int64_t> all_gather_batch_sizes(ProcessGroup& group, int64_t batch,
                                            const std::string& name);

// See above. `weights`: the replicated tables (their shapes); grads[i].table indexes them.
std::vector<runtime::RowSparseGrad> all_reduce_row_grads(
    ProcessGroup& group, const std::vector<runtime::Tensor>& weights,
    const std::vector<runtime::RowSparseGrad>& grads, runtime::DType dtype,
    const std::string& name);

}  // namespace mt::parallel
