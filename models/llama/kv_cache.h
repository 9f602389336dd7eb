// KVCache: the keys and values of the tokens already seen, per layer, for incremental decoding of
// the Llama Transformer (Transformer::forward_cached). Each layer holds preallocated buffers
//   k, v  [batch, n_kv_heads, max_seq, head_dim]
// of which positions [0, length()) are filled. A cached forward over T new tokens runs at position
// offset p = length(): each layer append()s its T new keys/values (after RoPE) at [p, p + T) and
// attends over [0, p + T); once every layer has appended, advance(T) makes them part of the cache.
// A pipeline stage's cache holds its own layers alone (`layers`, global indices as the blocks'
// layer_id). The cache is for inference only (no autograd); it is move-only, since copies would
// share buffers.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "models/llama/model_args.h"
#include "runtime/core/tensor.h"

namespace mt::models::llama {

class KVCache {
 public:
  // Zeroed buffers for `batch` sequences of up to `max_seq` tokens (0: args.max_seq_len, which is
  // also the upper bound), in options' dtype and device (the dtype of the model's keys: its
  // parameters' dtype), for the layers [layers.begin, layers.end) (default: all), of
  // args.kv_heads() / kv_head_shards heads (a tensor-parallel rank holds a share of them).
  KVCache(const ModelArgs& args, int64_t batch, runtime::TensorOptions options,
          int64_t max_seq = 0, LayerRange layers = {}, int64_t kv_head_shards = 1);
  KVCache(KVCache&&) = default;
  KVCache& operator=(KVCache&&) = default;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  int64_t n_layers() const { return int64_t(k_.size()); }
  int64_t first_layer() const { return first_layer_; }  // the global index of the first
  int64_t batch() const { return batch_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t max_seq() const { return max_seq_; }
  int64_t length() const { return length_; }  // tokens stored (the next position offset)
  runtime::DType dtype() const { return k_.front().dtype(); }

  // Writes k, v [batch, n_kv_heads, T, head_dim] at positions [length(), length() + T) of `layer`
  // and returns that layer's keys and values over [0, length() + T) (views of the buffers). One
  // append per layer between two advance() calls; errors name the layer and the shapes.
  std::pair<runtime::Tensor, runtime::Tensor> append(int64_t layer, const runtime::Tensor& k,
                                                     const runtime::Tensor& v);
  // Commits T tokens: every layer must have appended exactly T since the last advance.
  void advance(int64_t t);
  // Commits what the layers appended since the last advance (the same count for each, >= 1) and
  // returns it: a forward's new tokens however its input was split (under sequence parallelism a
  // pipeline stage receives a share of them and its attention gathers the rest).
  int64_t commit();
  // Forgets appends not yet committed (after a failed forward): the cache stays as it was.
  void discard_pending();
  // Empties the cache (keeps the buffers).
  void reset();
  // Forgets the tokens from position `length` on (<= length()), e.g. padding a forward ran with:
  // the next forward writes over them.
  void truncate(int64_t length);

  // The full buffers of `layer` [batch, n_kv_heads, max_seq, head_dim].
  const runtime::Tensor& keys(int64_t layer) const;
  const runtime::Tensor& values(int64_t layer) const;

 private:
  void check_layer(int64_t layer, const char* what) const;

  int64_t batch_, n_kv_heads_, head_dim_, max_seq_, first_layer_;
  int64_t length_ = 0;
  std::vector<runtime::Tensor> k_, v_;
  std::vector<int64_t> pending_;  // tokens appended to each layer since the last advance
  // k_, v_ and pending_ by global layer index (check_layer first).
  size_t slot(int64_t layer) const { return size_t(layer - first_layer_); }
};

// Checks that `cache` fits a cached forward of the layers `range` of a model with `args`' kv heads
// (or a share of them) and head dim over `batch` sequences of at least `t` new tokens (the
// layers, heads, batch, and room for t more); `model` names the caller in errors.
void check_cache_fits(const KVCache& cache, const LayerRange& range, const ModelArgs& args,
                      int64_t batch, int64_t t, const char* model);

// A cached forward: runs `forward` (whose layers append their keys and values), then commits
// them; when it throws, the appends are forgotten and the cache stays as it was.
template <class Forward>
runtime::Tensor forward_and_commit(KVCache& cache, Forward&& forward) {
  cache.discard_pending();
  try {
    runtime::Tensor out = forward();
    cache.commit();
    return out;
  } catch (...) {
    cache.discard_pending();
    throw;
  }
}

}  // namespace mt::models::llama
