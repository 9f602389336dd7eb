// DLRM's feature interactions (models/dlrm/model_args.h): the pairwise dot interaction and the
// DCN-v2 cross network, written with runtime ops (so autograd differentiates them; no CUDA
// kernels of their own are needed: they run on whatever backend the ops have).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/nn/linear.h"
#include "runtime/nn/module.h"

namespace mt::models::dlrm {

using runtime::Tensor;

// dense [B, d], embeddings [B, F * d] (the KeyedTensor values: F features of dim d, one after
// another) -> [B, d + (F + 1) F / 2]: dense, then the dot products <v_i, v_j> for i < j of the
// vectors v_0 = dense, v_1..v_F = the embeddings, in row-major order of (i, j) (TorchRec takes
// the lower triangle, the same pairs; its order differs). Differentiable in both inputs.
Tensor dot_interaction(const Tensor& dense, const Tensor& embeddings, int64_t num_features);

// The (i, j), i < j, pairs of dot_interaction's output columns after the dense ones.
std::vector<std::pair<int64_t, int64_t>> interaction_pairs(int64_t num_vectors);

// DCN-v2 cross network (Wang et al. 2021; TorchRec's CrossNet / LowRankCrossNet) on x0 [B, D]:
//   x_{l+1} = x0 * (W_l x_l + b_l) + x_l,   l = 0..L-1
// with W_l a full [D, D] Linear ("layers.<l>.w") or, for low_rank r > 0, W_l = U_l V_l:
// "layers.<l>.v" Linear(D, r, no bias) then "layers.<l>.u" Linear(r, D, bias).
class CrossNet : public runtime::nn::Module {
 public:
  CrossNet(int64_t dim, int64_t num_layers, int64_t low_rank);
  Tensor operator()(const Tensor& x0);
  int64_t dim() const { return dim_; }

 private:
  struct Layer : runtime::nn::Module {
    Layer(int64_t dim, int64_t low_rank);
    std::shared_ptr<runtime::nn::Linear> w, v, u;  // w (full) or v, u (low rank)
  };
  int64_t dim_;
  std::vector<std::shared_ptr<Layer>> layers_;
};

}  // namespace mt::models::dlrm
