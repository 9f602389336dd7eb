// Shared by optim_test (CPU) and fused_ops_gpu_test (CUDA): Optimizer::step(grad_scale) against
// clipping the gradients first and stepping without it, for AdamW (multi-tensor kernel) and SGD
// (the default path, scaled copies), f32, bf16 and f64 parameters, a coefficient that clips and
// one that does not. Parameters must come out bitwise equal and the gradients untouched.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/ops/factory.h"
#include "runtime/optim/adamw.h"
#include "runtime/optim/clip_grad.h"
#include "runtime/optim/sgd.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime::optim {

inline std::unique_ptr<Optimizer> make_optimizer(bool adamw, const std::vector<Tensor>& params) {
  if (adamw) return std::make_unique<AdamW>(params, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  return std::make_unique<SGD>(params, SGDOptions{.lr = 1e-2, .momentum = 0.9});
}

inline void expect_grad_scale_equals_clipping_first(Device device) {
  const std::vector<int64_t> sizes = {1, 7, 1024, 5000};
  for (const bool adamw : {true, false}) {
    for (const DType t : {DType::F32, DType::BF16, DType::F64}) {
      for (const double max_norm : {0.5, 1e6}) {  // clips / does not
        SCOPED_TRACE(::testing::Message() << (adamw ? "AdamW " : "SGD ") << dtype_name(t)
                                          << " max_norm " << max_norm);
        std::vector<Tensor> clipped, folded, grads;
        for (size_t i = 0; i < sizes.size(); ++i) {
          const Tensor p0 = testing::randn_as({sizes[i]}, t, 40 + i).to(device);
          clipped.push_back(p0.clone().set_requires_grad(true));
          folded.push_back(p0.clone().set_requires_grad(true));
          grads.push_back(testing::randn_as({sizes[i]}, t, 80 + i).to(device));
        }
        auto opt_clipped = make_optimizer(adamw, clipped);
        auto opt_folded = make_optimizer(adamw, folded);
        for (int step = 0; step < 2; ++step) {
          for (size_t i = 0; i < sizes.size(); ++i) {
            clipped[i].set_grad(grads[i].clone());
            folded[i].set_grad(grads[i].clone());
          }
          const Tensor total = norm_from_pow(local_norm_pow_tensor(clipped, 2.0), 2.0);
          clip_grads_with_norm_(clipped, max_norm, total);
          opt_clipped->step();
          opt_folded->step(clip_coefficient(total, max_norm));
        }
        for (size_t i = 0; i < sizes.size(); ++i) {
          EXPECT_TRUE(testing::all_close(folded[i], clipped[i], 0, 0)) << "parameter " << i;
          EXPECT_TRUE(testing::all_close(folded[i].grad(), grads[i], 0, 0)) << "gradient " << i;
        }
      }
    }
  }
}

}  // namespace mt::runtime::optim
