// Expert parallelism's dispatch and combine: counts exchange, uneven all-to-alls, regrouping.
#include "parallel/expert/token_exchange.h"

#include <numeric>

#include "parallel/comm/comm_trace.h"
#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"

namespace mt::parallel {

namespace {

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

Tensor exchange_rows(ProcessGroup& group, const Tensor& x, const std::vector<int64_t>& out_splits,
                     const std::vector<int64_t>& in_splits, const std::string& name) {
  runtime::Shape shape = x.shape();
  shape[0] = total(out_splits);
  Tensor out = runtime::empty(shape, x.options().with_requires_grad(false));
  group.all_to_all_single(out, x, out_splits, in_splits, name);
  return out;
}

}  // namespace

Tensor all_to_all_rows(std::shared_ptr<ProcessGroup> group, const Tensor& x,
                       std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                       const std::string& name) {
  MT_CHECK(x.dim() >= 1, "all_to_all_rows (", name, "): expected a tensor of rows, got 0-D");
  MT_CHECK(int64_t(in_splits.size()) == group->size() &&
               int64_t(out_splits.size()) == group->size(),
           "all_to_all_rows (", name, "): expected ", group->size(), " split sizes per side, got ",
           in_splits.size(), " and ", out_splits.size());
  MT_CHECK(total(in_splits) == x.size(0), "all_to_all_rows (", name, "): input splits sum to ",
           total(in_splits), " rows but x has ", x.size(0));
  const Tensor xc = x.detach().contiguous();
  Tensor out = exchange_rows(*group, xc, out_splits, in_splits, name);
  if (runtime::autograd::any_requires_grad({x})) {
    // The backward's exchange serves what the forward's did (communication traces).
    runtime::autograd::record(
        "all_to_all_rows", {x}, {out},
        [group, out_splits, in_splits, name, purpose = ScopedCommPurpose::current()](
            const runtime::autograd::BackwardArgs& args) {
          ScopedCommPurpose serves(purpose);
          const Tensor g = args.grad(0).contiguous();
          return std::vector<Tensor>{
              exchange_rows(*group, g, in_splits, out_splits, name + ".backward")};
        });
  }
  return out;
}

ExpertTokenExchange::ExpertTokenExchange(std::shared_ptr<ProcessGroup> group, int64_t num_experts)
    : group_(std::move(group)), num_experts_(num_experts) {
  MT_CHECK(group_ != nullptr, "ExpertTokenExchange: no ep group");
  MT_CHECK(num_experts_ > 0 && num_experts_ % group_->size() == 0, "expert parallelism: ",
           num_experts_, " routed experts cannot be split evenly over ep = ", group_->size(),
           " ranks (", group_->name(), "); choose an ep degree that divides the expert count");
  num_local_ = num_experts_ / group_->size();
}

std::pair<Tensor, std::vector<int64_t>> ExpertTokenExchange::dispatch(
    const Tensor& x, const std::vector<int64_t>& counts) {
  MT_CHECK(int64_t(counts.size()) == num_experts_, "expert dispatch: expected ", num_experts_,
           " per-expert counts, got ", counts.size());
  MT_CHECK(total(counts) == x.size(0), "expert dispatch: the counts sum to ", total(counts),
           " rows but x has ", x.size(0));
  const int64_t ranks = group_->size(), local = num_local_;
  // Counts first: recv[i][l] = rows rank i sends to this rank's local expert l.
  const auto on_group = runtime::TensorOptions{}
                            .with_dtype(runtime::DType::I64)
                            .with_device(group_->device_type() == runtime::DeviceType::CPU
                                             ? runtime::Device::cpu()
                                             : x.device());
  Tensor sent = runtime::from_vector<int64_t>(counts, {num_experts_}, on_group);
  Tensor received = runtime::empty({num_experts_}, on_group);
  group_->all_to_all_single(received, sent, {}, {}, "ep.dispatch.counts");
  const std::vector<int64_t> recv = received.to_vector<int64_t>();

  send_splits_.assign(size_t(ranks), 0);
  recv_splits_.assign(size_t(ranks), 0);
  std::vector<int64_t> local_counts(size_t(local), 0);
  for (int64_t j = 0; j < ranks; ++j) {
    for (int64_t l = 0; l < local; ++l) {
      send_splits_[size_t(j)] += counts[size_t(j * local + l)];
      recv_splits_[size_t(j)] += recv[size_t(j * local + l)];
      local_counts[size_t(l)] += recv[size_t(j * local + l)];
    }
  }
  const Tensor by_rank = all_to_all_rows(group_, x, recv_splits_, send_splits_, "ep.dispatch");

  // Received rows come as (source rank, local expert) blocks; the experts want (expert, rank).
  std::vector<int64_t> block_start(size_t(ranks * local));
  int64_t pos = 0;
  for (int64_t i = 0; i < ranks * local; ++i) {
    block_start[size_t(i)] = pos;
    pos += recv[size_t(i)];
  }
  std::vector<int64_t> order;
  std::vector<int64_t> inverse(static_cast<size_t>(pos));
  order.reserve(size_t(pos));
  for (int64_t l = 0; l < local; ++l) {
    for (int64_t i = 0; i < ranks; ++i) {
      const int64_t start = block_start[size_t(i * local + l)];
      for (int64_t k = 0; k < recv[size_t(i * local + l)]; ++k) {
        inverse[size_t(start + k)] = int64_t(order.size());
        order.push_back(start + k);
      }
    }
  }
  const auto index_options = runtime::TensorOptions{}.with_dtype(runtime::DType::I64).with_device(x.device());
  to_expert_order_ = runtime::from_vector<int64_t>(order, {pos}, index_options);
  to_rank_order_ = runtime::from_vector<int64_t>(inverse, {pos}, index_options);
  dispatched_ = true;
  return {runtime::index_select(by_rank, 0, to_expert_order_), local_counts};
}

Tensor ExpertTokenExchange::combine(const Tensor& y) {
  MT_CHECK(dispatched_, "expert combine: no dispatch to undo (call dispatch first)");
  MT_CHECK(y.dim() >= 1 && y.size(0) == to_rank_order_.numel(), "expert combine: expected ",
           to_rank_order_.numel(), " rows (as the last dispatch returned), got ",
           y.dim() >= 1 ? y.size(0) : 0);
  dispatched_ = false;
  const Tensor by_rank = runtime::index_select(y, 0, to_rank_order_);
  return all_to_all_rows(group_, by_rank, send_splits_, recv_splits_, "ep.combine");
}

}  // namespace mt::parallel
