// FSDPParamGroup: the parameters of one fully_shard call, moved together with ONE collective each
// way through flat buffers (FSDP2's copy-in/copy-out):
//
//   unshard:  copy every shard (cast to the compute dtype) into a flat [T] buffer, all-gather it
//             into [n * T] on the shard group, copy each rank's pieces into the unsharded tensors.
//   reduce:   copy every unsharded gradient (cast to the reduce dtype) into a flat [n * T] buffer,
//             reduce-scatter it (sum) into [T] on the shard group, all-reduce that over the
//             replicate group (HSDP), divide by the gradient divide factor, and add each piece to
//             its shard's .grad.
//
// T is the sum of the parameters' padded shard sizes, so rank r's pieces sit at [r*T, (r+1)*T).
//
// Float8 all-gather (parameters with FSDPParam::float8_all_gather, more than one shard): those
// weights travel as e4m3 codes in a second, byte, all-gather. Their scale is the whole weight's:
// one all-reduce (max) of the group's per-shard amaxes first, over the compute-dtype values, so
// the codes are exactly those float8_linear would make from the gathered weight. The codes are
// registered for the unsharded weight (register_float8_weight_codes), which is never filled.
// Both directions can run asynchronously on the group's communication thread; the wait_* calls
// finish them on the calling thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"
#include "parallel/fsdp/fsdp_param.h"
#include "parallel/fsdp/mixed_precision.h"
#include "parallel/mesh/device_mesh.h"

namespace mt::parallel {

class FSDPParamGroup {
 public:
  enum class State { Sharded, Unsharding, Unsharded };

  // The mesh's last dimension shards; a first dimension (2-D meshes) replicates (HSDP).
  FSDPParamGroup(std::string module_type, std::vector<std::unique_ptr<FSDPParam>> params,
                 std::shared_ptr<DeviceMesh> mesh, MixedPrecisionPolicy policy,
                 double gradient_divide_factor);
  ~FSDPParamGroup();  // unregisters float8 codes still registered
  FSDPParamGroup(const FSDPParamGroup&) = delete;
  FSDPParamGroup& operator=(const FSDPParamGroup&) = delete;

  // The module's path from the outermost module fully_shard was applied to ("layers.3"), set
  // by that call; until then (or for a module no sharded ancestor contains) its type name.
  void set_module_path(std::string path) { module_path_ = std::move(path); }
  // What this group's collectives serve, in traces: the path, else the module's type.
  const std::string& comm_purpose() const {
    return module_path_.empty() ? module_type_ : module_path_;
  }
  const std::vector<std::unique_ptr<FSDPParam>>& params() const { return params_; }
  const std::shared_ptr<DeviceMesh>& mesh() const { return mesh_; }
  State state() const { return state_; }
  int64_t unsharded_bytes() const;  // all parameters, in the compute dtype

  // Sharded -> Unsharding (async) or Unsharded. No-op unless Sharded. A shard group of one rank
  // goes straight to Unsharded (no collective: each shard is cast into place).
  void unshard(bool async);
  // Unsharding -> Unsharded (waits for the all-gather, copies out). No-op unless Unsharding.
  void wait_for_unshard();
  // -> Sharded: releases the unsharded storage (waits for an all-gather in flight first).
  void reshard();
  // Points the module's slots at the unsharded (compute) or the sharded tensors.
  void use_unsharded_params() const;
  void use_sharded_params() const;

  // Starts reducing the unsharded gradients (async) and drops them. False when no parameter
  // has a gradient (nothing started). With one rank and no replicate group the gradients land on
  // the shards right away (cast to the reduce dtype and scaled as the collectives would).
  bool start_reduce_scatter();
  // Finishes the reduction started above: gradients land on the shards. No-op when none runs.
  void wait_for_reduce_scatter();

  // Float8 all-gather (precompute_float8_scales, fully_shard.h): how many parameters travel as
  // codes, each one's shard amax (over its compute-dtype values) into out[k], and the whole
  // weights' amaxes to use instead of all-reducing the group's own at each unshard (undefined:
  // all-reduce them again).
  int64_t float8_gathered_count() const;
  ProcessGroup& shard_group() const { return *shard_group_; }
  void float8_shard_amaxes(const Tensor& out) const;
  void set_float8_amaxes(Tensor amaxes) { float8_amaxes_ = std::move(amaxes); }
  // The whole weights' amaxes from the shards' (in place): a max over the shard group and, with
  // tensor parallelism (FullyShardOptions::float8_amax_group), over the tp group.
  void reduce_float8_amaxes(const Tensor& amaxes, const std::string& name) const;
  void set_float8_amax_group(std::shared_ptr<ProcessGroup> group) {
    float8_amax_group_ = std::move(group);
  }
  const ProcessGroup* float8_amax_group() const { return float8_amax_group_.get(); }

 private:
  std::string module_type_, module_path_;
  std::vector<std::unique_ptr<FSDPParam>> params_;
  std::vector<int64_t> offsets_;  // of each parameter's piece in a rank's [T] block
  int64_t shard_numel_ = 0;       // T
  // The all-gathers' blocks: the compute-dtype one without the float8 parameters, and the codes
  // of those (offsets of each parameter in the block it travels in).
  std::vector<int64_t> gather_offsets_;
  int64_t gather_numel_ = 0, float8_numel_ = 0;
  bool gathers_float8(size_t i) const {  // parameter i travels as codes
    return shard_group_->size() > 1 && params_[i]->float8_all_gather();
  }
  void start_float8_all_gather(bool async);
  void finish_float8_all_gather();
  std::shared_ptr<DeviceMesh> mesh_;
  ProcessGroup* shard_group_;
  ProcessGroup* replicate_group_ = nullptr;  // HSDP only
  runtime::DType compute_dtype_, reduce_dtype_;
  runtime::Device device_;  // where the shards, the flat buffers and the collectives live
  double gradient_divide_factor_;

  State state_ = State::Sharded;
  Work all_gather_work_, float8_work_;
  Tensor all_gather_in_, all_gather_out_;
  Tensor float8_in_, float8_out_, float8_scale_inv_;  // scale_inv: one per float8 parameter
  Tensor float8_amaxes_;                              // precomputed, or undefined
  std::shared_ptr<ProcessGroup> float8_amax_group_;   // tp, or null
  std::vector<Tensor> float8_shard_values() const;    // the shards in the compute dtype

  bool reduce_pending_ = false;
  Work reduce_scatter_work_;
  Tensor reduce_in_, reduce_out_;
  std::vector<bool> has_grad_;
};

}  // namespace mt::parallel
