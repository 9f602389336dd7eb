// ContextParallel's ring attention ("alltoall" rotate method; context_parallel.h). Each rank
// holds two query chunks and two key/value chunks of the sequence (global chunks r and
// 2 cp - 1 - r). At ring step s it holds the key/value chunks of rank (r - s) mod cp; a query
// chunk of global index a attends over a key chunk of global index b fully when b < a, causally
// when b == a (the same positions: the usual top-left mask), and not at all when b > a.
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "parallel/context/context_parallel.h"
#include "runtime/autograd/function.h"
#include "runtime/core/error.h"
#include "runtime/ops/attention.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/join.h"

namespace mt::parallel {

using runtime::AttentionBlock;
using runtime::Tensor;

namespace {

// Tags of the ring's messages (one MPI communicator per cp group; messages between two ranks with
// the same tag arrive in order).
enum RingTag : int { kKeys = 1, kValues = 2, kKeyGrads = 3, kValueGrads = 4 };

// The ring over a cp group: each step sends to the next rank and receives from the previous.
class Ring {
 public:
  Ring(ProcessGroup& group, int64_t rank, int64_t size)
      : group_(group), next_(int((rank + 1) % size)), prev_(int((rank + size - 1) % size)) {}

  // Posts the send of `out` and the receive into a new tensor like it as one batch (on NCCL one
  // group: every rank's send to its next pairs with that rank's receive instead of waiting for it
  // in an in-order stream); wait() finishes both. Every rank passes in the same order.
  Tensor pass(const Tensor& out, int tag, const char* name) {
    using Op = ProcessGroup::P2POp;
    Tensor in = runtime::empty(out.shape(), out.options());
    for (Work& w : group_.batch_isend_irecv({Op{Op::Kind::Recv, in, prev_, tag, name},
                                             Op{Op::Kind::Send, out, next_, tag, name}}))
      works_.push_back(std::move(w));
    return in;
  }
  void wait() {
    for (const Work& w : works_) w.wait();
    works_.clear();
  }

 private:
  ProcessGroup& group_;
  int next_, prev_;
  std::vector<Work> works_;
};

// Calls fn(query chunk, key chunk, causal) for each pair of this rank's query chunks and the key
// chunks of `holder` that the queries see.
template <class Fn>
void for_each_visible_block(int64_t rank, int64_t holder, int64_t cp, Fn&& fn) {
  const auto queries = load_balanced_chunks(rank, cp), keys = load_balanced_chunks(holder, cp);
  for (int64_t qi = 0; qi < 2; ++qi)
    for (int64_t ki = 0; ki < 2; ++ki)
      if (keys[size_t(ki)] <= queries[size_t(qi)])
        fn(qi, ki, keys[size_t(ki)] == queries[size_t(qi)]);
}

}  // namespace

Tensor ContextParallel::ring_attention(const Tensor& q, const Tensor& k, const Tensor& v) const {
  ProcessGroup& group = mesh_->group(0);
  const int64_t cp = degree(), r = rank(), c = q.size(2) / 2;
  const Tensor keys = k.detach().contiguous(), values = v.detach().contiguous();
  const auto chunk = [c](const Tensor& t, int64_t i) { return t.narrow(2, i * c, c); };

  // Forward: each query chunk's blocks merged in ring order (the same on every run).
  std::array<std::optional<AttentionBlock>, 2> whole;
  {
    Ring ring(group, r, cp);
    Tensor k_held = keys, v_held = values;
    for (int64_t step = 0; step < cp; ++step) {
      Tensor k_next, v_next;
      if (step + 1 < cp) {  // the next chunks travel while this step computes
        k_next = ring.pass(k_held, kKeys, "context_parallel.ring_keys");
        v_next = ring.pass(v_held, kValues, "context_parallel.ring_values");
      }
      for_each_visible_block(r, (r + cp - step) % cp, cp, [&](int64_t qi, int64_t ki, bool causal) {
        const AttentionBlock block = runtime::attention_block_forward(
            chunk(q, qi), chunk(k_held, ki), chunk(v_held, ki), causal);
        if (whole[size_t(qi)]) {
          runtime::merge_attention_blocks(*whole[size_t(qi)], block);
        } else {
          whole[size_t(qi)] = block;
        }
      });
      ring.wait();
      k_held = k_next;
      v_held = v_next;
    }
  }
  // Every query chunk sees key chunk 0 (it precedes every other), so both are set.
  const Tensor out = runtime::cat({whole[0]->out, whole[1]->out}, 2).to(q.dtype());
  if (!runtime::autograd::any_requires_grad({q, k, v})) return out;

  runtime::autograd::record(
      "context_parallel_ring_attention", {q, k, v}, {out},
      [mesh = mesh_, sq = runtime::autograd::SavedTensor(q.detach()),
       sk = runtime::autograd::SavedTensor(keys), sv = runtime::autograd::SavedTensor(values),
       whole, chunk, cp, r,
       dtypes = std::array<runtime::DType, 3>{q.dtype(), k.dtype(), v.dtype()}](
          const runtime::autograd::BackwardArgs& args) -> std::vector<Tensor> {
        ProcessGroup& group = mesh->group(0);
        const Tensor& q = sq.get();
        const Tensor dout = args.grad(0);
        std::array<Tensor, 2> dq;
        Ring ring(group, r, cp);
        Tensor k_held = sk.get(), v_held = sv.get();
        // The held chunks' gradients travel with them and are back home after a full turn.
        Tensor dk_held = runtime::zeros(k_held.shape(), whole[0]->out.options());
        Tensor dv_held = runtime::zeros(v_held.shape(), whole[0]->out.options());
        for (int64_t step = 0; step < cp; ++step) {
          Tensor k_next, v_next;
          if (step + 1 < cp) {
            k_next = ring.pass(k_held, kKeys, "context_parallel.ring_keys");
            v_next = ring.pass(v_held, kValues, "context_parallel.ring_values");
          }
          for_each_visible_block(
              r, (r + cp - step) % cp, cp, [&](int64_t qi, int64_t ki, bool causal) {
                const std::vector<Tensor> g = runtime::attention_block_backward(
                    chunk(dout, qi), chunk(q, qi), chunk(k_held, ki), chunk(v_held, ki),
                    *whole[size_t(qi)], causal);
                dq[size_t(qi)] = dq[size_t(qi)].defined() ? runtime::add(dq[size_t(qi)], g[0])
                                                          : g[0];
                runtime::add_(chunk(dk_held, ki), g[1]);
                runtime::add_(chunk(dv_held, ki), g[2]);
              });
          ring.wait();  // the next chunks arrived, and the held ones' sends are done
          const Tensor dk_next = ring.pass(dk_held, kKeyGrads, "context_parallel.ring_key_grads");
          const Tensor dv_next =
              ring.pass(dv_held, kValueGrads, "context_parallel.ring_value_grads");
          ring.wait();
          dk_held = dk_next;
          dv_held = dv_next;
          k_held = k_next;
          v_held = v_next;
        }
        return {runtime::cat({dq[0], dq[1]}, 2).to(dtypes[0]), dk_held.to(dtypes[1]),
                dv_held.to(dtypes[2])};
      });
  return out;
}

}  // namespace mt::parallel
