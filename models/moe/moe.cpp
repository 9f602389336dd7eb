#include "models/moe/moe.h"

#include "runtime/autograd/checkpoint.h"
#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/core/host_copy.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/index.h"
#include "runtime/ops/reduce.h"

namespace mt::models::moe {

using runtime::DType;

namespace {

// True in the forward passes whose routing should be counted for load balancing: a forward
// recording a graph, or a checkpointed region's first run (under no_grad) -- not its recompute in
// backward, nor an evaluation forward under no_grad.
bool counts_this_forward() {
  using runtime::autograd::CheckpointPhase;
  const CheckpointPhase phase = runtime::autograd::checkpoint_phase();
  return phase == CheckpointPhase::Forward ||
         (phase == CheckpointPhase::None && runtime::GradMode::enabled());
}

void check_shards(int64_t shards, const std::function<void(Tensor&)>& sum, const char* what) {
  MT_CHECK(shards >= 1 && (shards == 1 || sum), "MoE::", what,
           ": expected shards >= 1 and, above 1, a sum over them; got ", shards);
}

}  // namespace

MoE::MoE(const ModelArgs& args, double out_init_std, TensorOptions options)
    : nn::Module("MoE"),
      num_experts_(args.n_routed_experts),
      top_k_(args.top_k),
      aux_loss_alpha_(args.aux_loss_alpha) {
  options.requires_grad = false;
  expert_bias = runtime::zeros({num_experts_}, options.with_dtype(DType::F32));
  tokens_per_expert = runtime::zeros({num_experts_}, options.with_dtype(DType::I64));
  register_buffer("expert_bias", expert_bias, /*persistent=*/true);
  register_buffer("tokens_per_expert", tokens_per_expert, /*persistent=*/false);
  experts = register_module(
      "experts", std::make_shared<GroupedExperts>(args.dim, args.moe_inter_dim, num_experts_,
                                                  out_init_std, options));
  router = register_module(
      "router", std::make_shared<Router>(args.dim, num_experts_, top_k_, args.score_func,
                                         args.route_norm, args.route_scale, out_init_std, options));
  if (args.n_shared_experts > 0) {
    shared_experts = register_module(
        "shared_experts",
        std::make_shared<llama::FeedForward>(args.dim, args.moe_inter_dim * args.n_shared_experts,
                                             out_init_std, options));
  }
}

Tensor MoE::operator()(const Tensor& x) { return forward(x)[0]; }

std::vector<Tensor> MoE::forward(const Tensor& x) {
  MT_CHECK(x.defined() && x.dim() == 3 && x.size(2) == experts->dim(), "MoE: expected x [B, T, ",
           experts->dim(), "], got ", x.defined() ? x.shape() : runtime::Shape{});
  return call_multi({x}, [this](const std::vector<Tensor>& in) {
    const Tensor& x3 = in[0];
    const int64_t b = x3.size(0), t = x3.size(1), d = x3.size(2), n = b * t, k = top_k_;
    const int64_t e_count = num_experts_;
    const Tensor xf = x3.reshape({n, d});
    const RouterOutput r = (*router)(xf, expert_bias);
    // The routing goes to the host (the grouped matmuls' shapes come from it) while the device
    // runs the shared experts, queued behind the copy: on a GPU the host's wait and its sort
    // below overlap them.
    runtime::HostCopy routing(r.indices);
    const Tensor shared = shared_experts ? (*shared_experts)(xf) : Tensor();

    // Stable counting sort of the n*k (token, expert) pairs by expert, on the host.
    const std::vector<int64_t> chosen = routing.get().to_vector<int64_t>();
    std::vector<int64_t> counts(size_t(e_count), 0);
    for (int64_t e : chosen) {
      MT_CHECK(e >= 0 && e < e_count, "MoE: router chose expert ", e, " outside [0, ", e_count,
               ")");
      ++counts[size_t(e)];
    }
    std::vector<int64_t> next(size_t(e_count), 0);
    for (int64_t e = 1; e < e_count; ++e)
      next[size_t(e)] = next[size_t(e - 1)] + counts[size_t(e - 1)];
    std::vector<int64_t> pair_of(chosen.size()), token_of(chosen.size());
    for (size_t p = 0; p < chosen.size(); ++p) {
      const int64_t slot = next[size_t(chosen[p])]++;
      pair_of[size_t(slot)] = int64_t(p);
      token_of[size_t(slot)] = int64_t(p) / k;
    }
    const TensorOptions idx_opts = TensorOptions{}.with_dtype(DType::I64).with_device(x3.device());
    const Tensor pair_t = runtime::from_vector<int64_t>(pair_of, {n * k}, idx_opts);
    const Tensor token_t = runtime::from_vector<int64_t>(token_of, {n * k}, idx_opts);

    if (counts_this_forward()) {
      runtime::NoGradGuard no_grad;
      runtime::add_(tokens_per_expert, runtime::from_vector<int64_t>(counts, {e_count}, idx_opts));
    }
    last_indices = r.indices.detach();

    const Tensor x_sorted = runtime::index_select(xf, 0, token_t);
    const Tensor w_sorted = runtime::index_select(r.weights.reshape({n * k}), 0, pair_t);
    Tensor y = (*experts)(x_sorted, counts);
    y = runtime::mul(y.to(w_sorted.dtype()), w_sorted.unsqueeze(1)).to(x3.dtype());
    Tensor out = runtime::index_add(runtime::zeros({n, d}, x3.options()), 0, token_t, y);
    if (shared.defined()) out = runtime::add(out, shared);
    std::vector<Tensor> result{out.reshape({b, t, d})};

    if (aux_loss_alpha_ > 0) {
      // f [B, E]: E / (k T) times how often sequence b routed to expert i (over every shard of
      // it, T the whole sequence's length).
      std::vector<double> routed(size_t(b * e_count), 0.0);
      for (size_t p = 0; p < chosen.size(); ++p) {
        const int64_t seq = int64_t(p) / k / t;
        routed[size_t(seq * e_count + chosen[p])] += 1;
      }
      Tensor f_t = runtime::from_vector<double>(
          routed, {b, e_count},
          TensorOptions{}.with_dtype(r.scores.dtype()).with_device(x3.device()));
      for (const Shards* s : {&sequence_shards_, &input_shards_})
        if (s->count > 1) s->sum(f_t);
      const int64_t whole_t = t * sequence_shards_.count * input_shards_.count;
      f_t = runtime::mul(f_t, double(e_count) / (double(k) * double(whole_t)));
      Tensor s = r.scores;
      s = runtime::div(s, runtime::sum(s, {1}, true));
      const Tensor p_mean = runtime::mean(s.reshape({b, t, e_count}), {1});  // [B, E]
      result.push_back(
          runtime::mul(runtime::sum(runtime::mul(p_mean, f_t)), aux_loss_alpha_ / double(b)));
    }
    return result;
  });
}

void MoE::set_sequence_shards(int64_t shards, std::function<void(Tensor&)> sum) {
  check_shards(shards, sum, "set_sequence_shards");
  sequence_shards_ = {shards, std::move(sum)};
}

void MoE::set_input_shards(int64_t shards, std::function<void(Tensor&)> sum) {
  check_shards(shards, sum, "set_input_shards");
  input_shards_ = {shards, std::move(sum)};
}

std::vector<int64_t> MoE::tokens_per_expert_counts() const {
  return tokens_per_expert.to_vector<int64_t>();
}

void MoE::reset_tokens_per_expert() {
  runtime::NoGradGuard no_grad;
  tokens_per_expert.zero_();
}

}  // namespace mt::models::moe
