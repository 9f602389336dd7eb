// Parameter initialisation from the counter-based RNG (runtime/core/rng.h).
//
// Every draw is keyed by (seed, FQN of the parameter): element i of a parameter depends only on
// the seed, its fully qualified name and i, never on the thread count, the world size or how
// the parameter is sharded. Modules draw their own parameters in reset_parameters(ctx) with
// ctx.key("weight"), which is RandomKey(seed, "<module fqn>.weight").
//
// The fill functions write into an existing tensor (any floating dtype; values are computed in
// f64 and rounded once) under no_grad, so they may be used on parameters that require grad.
// `full_shape`/`block_offset` (optional) say that `t` is the block of a larger tensor starting
// at `block_offset`: the block then receives exactly the values the full draw holds there, so a
// rank can initialise just its shard. An InitBlockScope says the same for tensors whose module
// does not know they are blocks (FSDP shards), and takes precedence. Tensors may live on any
// device (values are drawn on the host and copied).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/core/rng.h"
#include "runtime/core/tensor.h"

namespace mt::runtime::nn {

// What Module::reset_parameters receives: the seed and the module's FQN prefix ("" for the root,
// "layers.0.attention." for a submodule).
struct InitContext {
  uint64_t seed = 0;
  std::string prefix;
  RandomKey key(const std::string& param_name) const {
    return RandomKey(seed, prefix + param_name);
  }
};

// Normal(mean, std).
void init_normal_(const Tensor& t, const RandomKey& key, double mean = 0.0, double std = 1.0,
                  const Shape& full_shape = {}, const Shape& block_offset = {});
// Uniform[low, high).
void init_uniform_(const Tensor& t, const RandomKey& key, double low, double high,
                   const Shape& full_shape = {}, const Shape& block_offset = {});
// Normal(mean, std) truncated to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_), by
// inverse-CDF sampling of one uniform per element (so it stays counter-based).
void init_trunc_normal_(const Tensor& t, const RandomKey& key, double mean = 0.0, double std = 1.0,
                        double a = -2.0, double b = 2.0, const Shape& full_shape = {},
                        const Shape& block_offset = {});
void init_constant_(const Tensor& t, double value);

// While alive, the fill functions above on this thread treat each added tensor (by its storage)
// as the block of a `full_shape` tensor at `block_offset`, whatever their arguments say: a
// module's reset_parameters run on its parameters' shards then writes each shard what the whole
// parameter holds there (parallel::init_sharded_parameters). Scopes do not nest.
class InitBlockScope {
 public:
  InitBlockScope();
  ~InitBlockScope();
  InitBlockScope(const InitBlockScope&) = delete;
  InitBlockScope& operator=(const InitBlockScope&) = delete;
  void add(const Tensor& t, Shape full_shape, Shape block_offset);

  struct Block {
    Shape full_shape;
    Shape offset;
  };
  // The active scope's block for t, or null.
  static const Block* find(const Tensor& t);

 private:
  std::map<const void*, Block> blocks_;  // by storage
};

// While alive on this thread, modules are built without parameter values: a parameter's memory is
// released as it registers (an untouched allocation, so no page of it was ever used) and
// init_weights does nothing (the fill functions above skip such parameters when their module's
// constructor initialises them). For a model that FSDP shards right away, after which each rank
// draws its shards only (parallel::init_sharded_parameters): nothing may read the parameters
// before.
class DeferredInitGuard {
 public:
  DeferredInitGuard();
  ~DeferredInitGuard();
  DeferredInitGuard(const DeferredInitGuard&) = delete;
  DeferredInitGuard& operator=(const DeferredInitGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

// Inverse error function on (-1, 1) (exposed for tests); +-inf at +-1.
double erfinv(double y);

}  // namespace mt::runtime::nn
