#include "models/llama/kv_cache.h"

#include "runtime/core/error.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"

namespace mt::models::llama {

using runtime::Shape;
using runtime::Tensor;

KVCache::KVCache(const ModelArgs& args, int64_t batch, runtime::TensorOptions options,
                 int64_t max_seq, LayerRange layers, int64_t kv_head_shards)
    : batch_(batch),
      n_kv_heads_(kv_head_shards >= 1 ? args.kv_heads() / kv_head_shards : 0),
      head_dim_(args.head_dim()),
      max_seq_(max_seq == 0 ? args.max_seq_len : max_seq),
      first_layer_(layers.begin) {
  args.validate();
  MT_CHECK(kv_head_shards >= 1 && args.kv_heads() % kv_head_shards == 0,
           "llama KVCache: the model's ", args.kv_heads(), " kv heads do not split into ",
           kv_head_shards, " equal shares");
  if (layers.end < 0) layers.end = args.n_layers;
  MT_CHECK(0 <= layers.begin && layers.begin < layers.end && layers.end <= args.n_layers,
           "llama KVCache: layers [", layers.begin, ", ", layers.end,
           ") are not a non-empty part of the model's ", args.n_layers, " layers");
  MT_CHECK(batch >= 1, "llama KVCache: expected batch >= 1, got ", batch);
  MT_CHECK(max_seq_ >= 1 && max_seq_ <= args.max_seq_len,
           "llama KVCache: expected max_seq in [1, max_seq_len = ", args.max_seq_len, "], got ",
           max_seq);
  MT_CHECK(runtime::is_floating(options.dtype), "llama KVCache: expected a floating dtype, got ",
           runtime::dtype_name(options.dtype));
  options.requires_grad = false;
  const Shape shape{batch_, n_kv_heads_, max_seq_, head_dim_};
  for (int64_t i = layers.begin; i < layers.end; ++i) {
    k_.push_back(runtime::zeros(shape, options));
    v_.push_back(runtime::zeros(shape, options));
  }
  pending_.assign(k_.size(), 0);
}

void KVCache::check_layer(int64_t layer, const char* what) const {
  MT_CHECK(layer >= first_layer_ && layer < first_layer_ + n_layers(), "llama KVCache::", what,
           ": layer ", layer, " outside the cache's layers [", first_layer_, ", ",
           first_layer_ + n_layers(), ")");
}

std::pair<Tensor, Tensor> KVCache::append(int64_t layer, const Tensor& k, const Tensor& v) {
  check_layer(layer, "append");
  MT_CHECK(k.defined() && v.defined() && k.dim() == 4 && k.shape() == v.shape(),
           "llama KVCache::append: layer ", layer,
           ": expected k and v of one shape [B, n_kv_heads, T, head_dim], got ",
           k.defined() ? k.shape() : Shape{}, " and ", v.defined() ? v.shape() : Shape{});
  const int64_t t = k.size(2);
  MT_CHECK(k.size(0) == batch_ && k.size(1) == n_kv_heads_ && k.size(3) == head_dim_ && t >= 1,
           "llama KVCache::append: layer ", layer, ": expected k of shape [", batch_, ", ",
           n_kv_heads_, ", T >= 1, ", head_dim_, "], got ", k.shape());
  MT_CHECK(k.dtype() == dtype() && v.dtype() == dtype(), "llama KVCache::append: layer ", layer,
           ": expected ", runtime::dtype_name(dtype()), " keys and values, got ",
           runtime::dtype_name(k.dtype()), " and ", runtime::dtype_name(v.dtype()));
  MT_CHECK(pending_[slot(layer)] == 0, "llama KVCache::append: layer ", layer,
           " appended twice without advance()");
  MT_CHECK(length_ + t <= max_seq_, "llama KVCache::append: ", length_, " cached + ", t,
           " new tokens exceed the cache's max_seq ", max_seq_);
  runtime::NoGradGuard no_grad;
  const Tensor& kc = k_[slot(layer)];
  const Tensor& vc = v_[slot(layer)];
  kc.narrow(2, length_, t).copy_(k);
  vc.narrow(2, length_, t).copy_(v);
  pending_[slot(layer)] = t;
  return {kc.narrow(2, 0, length_ + t), vc.narrow(2, 0, length_ + t)};
}

void KVCache::advance(int64_t t) {
  MT_CHECK(t >= 1, "llama KVCache::advance: expected t >= 1, got ", t);
  for (int64_t i = 0; i < n_layers(); ++i) {
    MT_CHECK(pending_[size_t(i)] == t, "llama KVCache::advance(", t, "): layer ",
             first_layer_ + i, " appended ", pending_[size_t(i)], " tokens");
  }
  length_ += t;
  discard_pending();
}

int64_t KVCache::commit() {
  const int64_t t = pending_.empty() ? 0 : pending_.front();
  advance(t);  // checks every layer appended t >= 1
  return t;
}

void KVCache::discard_pending() { pending_.assign(pending_.size(), 0); }

void KVCache::truncate(int64_t length) {
  MT_CHECK(length >= 0 && length <= length_, "llama KVCache::truncate: expected a length in [0, ",
           length_, "], got ", length);
  length_ = length;
  discard_pending();
}

void KVCache::reset() {
  length_ = 0;
  discard_pending();
}

const Tensor& KVCache::keys(int64_t layer) const {
  check_layer(layer, "keys");
  return k_[slot(layer)];
}

const Tensor& KVCache::values(int64_t layer) const {
  check_layer(layer, "values");
  return v_[slot(layer)];
}

void check_cache_fits(const KVCache& cache, const LayerRange& range, const ModelArgs& args,
                      int64_t batch, int64_t t, const char* model) {
  MT_CHECK(cache.first_layer() == range.begin &&
               cache.first_layer() + cache.n_layers() == range.end &&
               args.kv_heads() % cache.n_kv_heads() == 0 && cache.head_dim() == args.head_dim() &&
               cache.batch() == batch,
           model, "::forward_cached: cache of layers [", cache.first_layer(), ", ",
           cache.first_layer() + cache.n_layers(), "), batch ", cache.batch(), ", ",
           cache.n_kv_heads(), " kv heads of dim ", cache.head_dim(), " does not fit this model (",
           "layers [", range.begin, ", ", range.end, "), ", args.kv_heads(), " kv heads of dim ",
           args.head_dim(), ") and an input of batch ", batch);
  MT_CHECK(cache.length() + t <= cache.max_seq(), model, "::forward_cached: ", cache.length(),
           " cached + ", t, " new tokens exceed the cache's max_seq ", cache.max_seq(),
           " (model max_seq_len = ", args.max_seq_len, ")");
}

}  // namespace mt::models::llama
