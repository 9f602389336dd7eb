#include "parallel/context/context_parallel.h"

#include <string>

#include "parallel/tensor/redistribute.h"
#include "runtime/core/error.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"

namespace mt::parallel {

using runtime::Tensor;

namespace {

void check_split(int64_t seq_len, int64_t cp, const char* what) {
  MT_CHECK(cp >= 1 && seq_len > 0 && seq_len % (2 * cp) == 0, what, ": a sequence of ", seq_len,
           " tokens cannot be split over ", cp,
           " context-parallel ranks: load balancing cuts it into 2 x cp = ", 2 * cp,
           " equal chunks, so its length must be a multiple of ", 2 * cp);
}

}  // namespace

std::array<int64_t, 2> load_balanced_chunks(int64_t rank, int64_t cp) {
  return {rank, 2 * cp - 1 - rank};
}

std::vector<int64_t> load_balanced_positions(int64_t seq_len, int64_t cp, int64_t rank) {
  check_split(seq_len, cp, "context parallel");
  MT_CHECK(rank >= 0 && rank < cp, "context parallel: rank ", rank, " is not in [0, ", cp, ")");
  const int64_t chunk = seq_len / (2 * cp);
  std::vector<int64_t> positions;
  positions.reserve(size_t(2 * chunk));
  for (const int64_t c : load_balanced_chunks(rank, cp))
    for (int64_t i = 0; i < chunk; ++i) positions.push_back(c * chunk + i);
  return positions;
}

ContextParallel::ContextParallel(std::shared_ptr<DeviceMesh> mesh, ContextParallelRotate rotate)
    : mesh_(std::move(mesh)), rotate_(rotate) {
  MT_CHECK(mesh_ != nullptr && mesh_->ndim() == 1, "ContextParallel: expected a 1-D mesh, got ",
           mesh_ ? mesh_->describe() : std::string("none"));
}

Tensor ContextParallel::shard(const Tensor& batch) const {
  MT_CHECK(batch.dim() >= 2, "context parallel: expected a batch [B, S, ...], got shape ",
           batch.shape());
  const int64_t cp = degree(), seq = batch.size(1);
  check_split(seq, cp, "context parallel");
  const int64_t chunk = seq / (2 * cp);
  const auto [first, second] = load_balanced_chunks(rank(), cp);
  return runtime::cat({batch.narrow(1, first * chunk, chunk), batch.narrow(1, second * chunk, chunk)},
                      1)
      .detach();
}

Tensor ContextParallel::positions(int64_t seq_len, runtime::Device device) const {
  const std::vector<int64_t> p = load_balanced_positions(seq_len, degree(), rank());
  return runtime::from_vector<int64_t>(
      p, {int64_t(p.size())},
      runtime::TensorOptions{}.with_dtype(runtime::DType::I64).with_device(device));
}

void ContextParallel::sum_over_shards(Tensor& t) const {
  mesh_->group(0).all_reduce(t, ReduceOp::Sum, "cp.sequence_sum");
}

Tensor ContextParallel::gather_sequence(const Tensor& local, const char* what) const {
  // All-gather along dim 1 (rank-major: rank j's two chunks at [j T, (j + 1) T)); the gradient
  // each rank's attention gives the whole sequence is a partial sum, reduce-scattered back.
  const DTensor piece = from_local(local.contiguous(), mesh_, {Shard{1}});
  const Tensor ranks_order = to_local(
      redistribute(piece, {Replicate{}}, std::vector<Placement>{Partial{}},
                   std::string("context_parallel.") + what),
      std::vector<Placement>{Partial{}});
  // Sequence order: global chunk c < cp is rank c's first, chunk c >= cp rank 2 cp - 1 - c's
  // second.
  const int64_t cp = degree(), t = local.size(1), chunk = t / 2;
  std::vector<Tensor> chunks;
  for (int64_t c = 0; c < 2 * cp; ++c) {
    const int64_t holder = c < cp ? c : 2 * cp - 1 - c;
    chunks.push_back(ranks_order.narrow(1, holder * t + (c < cp ? 0 : chunk), chunk));
  }
  return runtime::cat(chunks, 1);
}

Tensor ContextParallel::attention(const Tensor& q, const Tensor& k, const Tensor& v) const {
  MT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(2) == k.size(2) &&
               k.size(2) == v.size(2) && q.size(2) % 2 == 0,
           "context parallel attention: expected q [B, Hq, T, D], k and v [B, Hkv, T, D] with "
           "the same even T (this rank's two chunks), got ",
           q.shape(), ", ", k.shape(), ", ", v.shape());
  return rotate_ == ContextParallelRotate::Ring ? ring_attention(q, k, v)
                                                : allgather_attention(q, k, v);
}

Tensor ContextParallel::allgather_attention(const Tensor& q, const Tensor& k,
                                            const Tensor& v) const {
  const int64_t cp = degree(), chunk = q.size(2) / 2;
  // [B, H, T, D] views of [B, T, H, D] activations: gathered along T in that layout.
  const Tensor keys = gather_sequence(k.transpose(1, 2), "keys").transpose(1, 2);
  const Tensor values = gather_sequence(v.transpose(1, 2), "values").transpose(1, 2);
  std::vector<Tensor> outs;
  int64_t first = 0;
  for (const int64_t c : load_balanced_chunks(rank(), cp)) {
    const int64_t seen = (c + 1) * chunk;  // keys [0, seen); bottom-right causal mask
    outs.push_back(runtime::scaled_dot_product_attention(
        q.narrow(2, first, chunk), keys.narrow(2, 0, seen), values.narrow(2, 0, seen),
        /*causal=*/true));
    first += chunk;
  }
  return runtime::cat(outs, 2);
}

}  // namespace mt::parallel
