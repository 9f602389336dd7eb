#include "runtime/sparse/keyed_jagged_tensor.h"

#include <ostream>

#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::sparse {
namespace {

Tensor as_i64_vector(const Tensor& t, const char* what) {
  MT_CHECK(t.defined(), "KeyedJaggedTensor: ", what, " must be defined");
  MT_CHECK(t.dtype() == DType::I64 || t.dtype() == DType::I32,
           "KeyedJaggedTensor: expected i32 or i64 ", what, ", got ", t.dtype());
  MT_CHECK(t.dim() == 1, "KeyedJaggedTensor: expected 1-D ", what, ", got shape ", t.shape());
  MT_CHECK(t.device().is_cpu(), "KeyedJaggedTensor: ", what, " must be on the CPU, got ",
           t.device());
  NoGradGuard ng;
  return t.detach().to(DType::I64).contiguous();
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, TensorOptions{}.with_dtype(DType::I64));
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

}  // namespace

KeyedJaggedTensor KeyedJaggedTensor::from_offsets(std::vector<std::string> keys,
                                                  const Tensor& values, const Tensor& offsets,
                                                  const Tensor& weights, int64_t stride) {
  KeyedJaggedTensor kjt;
  kjt.values_ = as_i64_vector(values, "values");
  kjt.offsets_ = as_i64_vector(offsets, "offsets");
  const int64_t K = int64_t(keys.size());
  const int64_t n_off = kjt.offsets_.numel();
  MT_CHECK(n_off >= 1, "KeyedJaggedTensor: offsets must hold at least one element (0), got none");
  if (stride < 0) {
    MT_CHECK(K > 0, "KeyedJaggedTensor: with no keys, give the stride (batch size)");
    MT_CHECK((n_off - 1) % K == 0, "KeyedJaggedTensor: ", n_off - 1,
             " lengths (offsets.numel() - 1) are not a multiple of the ", K, " keys");
    stride = (n_off - 1) / K;
  }
  MT_CHECK(n_off - 1 == K * stride, "KeyedJaggedTensor: expected ", K * stride + 1, " offsets for ",
           K, " keys and stride ", stride, ", got ", n_off);
  kjt.keys_ = std::move(keys);
  kjt.stride_ = stride;
  const int64_t* o = kjt.offsets_.data<int64_t>();
  std::vector<int64_t> len(size_t(K * stride));
  for (int64_t i = 0; i < K * stride; ++i) len[i] = o[i + 1] - o[i];
  kjt.lengths_ = i64_tensor(len);
  if (weights.defined()) {
    MT_CHECK(weights.is_floating_point() && weights.dim() == 1,
             "KeyedJaggedTensor: expected 1-D floating weights, got ", weights.dtype(), " ",
             weights.shape());
    NoGradGuard ng;
    kjt.weights_ = weights.detach().to(DType::F32).contiguous();
  }
  return kjt;
}

KeyedJaggedTensor KeyedJaggedTensor::from_lengths(std::vector<std::string> keys,
                                                  const Tensor& values, const Tensor& lengths,
                                                  const Tensor& weights, int64_t stride) {
  const Tensor len = as_i64_vector(lengths, "lengths");
  const int64_t n = len.numel();
  const int64_t* l = len.data<int64_t>();
  std::vector<int64_t> off(size_t(n + 1), 0);
  for (int64_t i = 0; i < n; ++i) off[i + 1] = off[i] + l[i];
  KeyedJaggedTensor kjt = from_offsets(std::move(keys), values, i64_tensor(off), weights, stride);
  kjt.lengths_ = len;  // keeps negative lengths visible to validate()
  return kjt;
}

KeyedJaggedTensor KeyedJaggedTensor::from_lengths(std::vector<std::string> keys,
                                                  const std::vector<int64_t>& values,
                                                  const std::vector<int64_t>& lengths,
                                                  const std::vector<float>& weights,
                                                  int64_t stride) {
  Tensor w;
  if (!weights.empty()) {
    w = Tensor::empty({int64_t(weights.size())});
    std::copy(weights.begin(), weights.end(), w.data<float>());
  }
  return from_lengths(std::move(keys), i64_tensor(values), i64_tensor(lengths), w, stride);
}

int64_t KeyedJaggedTensor::key_index(const std::string& key) const {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (keys_[i] == key) return int64_t(i);
  MT_CHECK(false, "KeyedJaggedTensor: no key '", key, "' (keys: ", keys_, ")");
  return -1;
}

std::vector<int64_t> KeyedJaggedTensor::offset_per_key() const {
  const int64_t K = num_keys();
  std::vector<int64_t> out(size_t(K + 1));
  const int64_t* o = offsets_.data<int64_t>();
  for (int64_t k = 0; k <= K; ++k) out[k] = o[k * stride_];
  return out;
}

std::vector<int64_t> KeyedJaggedTensor::length_per_key() const {
  const std::vector<int64_t> off = offset_per_key();
  std::vector<int64_t> out(keys_.size());
  for (size_t k = 0; k < out.size(); ++k) out[k] = off[k + 1] - off[k];
  return out;
}

JaggedTensor KeyedJaggedTensor::key_view(int64_t key) const {
  MT_CHECK(key >= 0 && key < num_keys(), "KeyedJaggedTensor: key index ", key, " outside [0, ",
           num_keys(), ")");
  const int64_t B = stride_;
  const int64_t* o = offsets_.data<int64_t>();
  const int64_t begin = o[key * B], end = o[(key + 1) * B];
  JaggedTensor jt;
  jt.values = values_.narrow(0, begin, end - begin);
  jt.lengths = lengths_.narrow(0, key * B, B);
  std::vector<int64_t> off(size_t(B + 1));
  for (int64_t b = 0; b <= B; ++b) off[b] = o[key * B + b] - begin;
  jt.offsets = i64_tensor(off);
  if (weights_.defined()) jt.weights = weights_.narrow(0, begin, end - begin);
  return jt;
}

JaggedTensor KeyedJaggedTensor::operator[](const std::string& key) const {
  return key_view(key_index(key));
}

void KeyedJaggedTensor::validate() const {
  const int64_t B = stride_, K = num_keys();
  const int64_t* l = lengths_.data<int64_t>();
  const int64_t* o = offsets_.data<int64_t>();
  MT_CHECK(o[0] == 0, "KeyedJaggedTensor: offsets must start at 0, got ", o[0]);
  for (int64_t i = 0; i < K * B; ++i) {
    MT_CHECK(l[i] >= 0, "KeyedJaggedTensor: negative length ", l[i], " for key '", keys_[i / B],
             "', sample ", i % B);
    MT_CHECK(o[i + 1] >= o[i], "KeyedJaggedTensor: offsets decrease at key '", keys_[i / B],
             "', sample ", i % B, " (", o[i], " -> ", o[i + 1], ")");
  }
  MT_CHECK(o[K * B] == values_.numel(), "KeyedJaggedTensor: the lengths sum to ", o[K * B],
           " but there are ", values_.numel(), " values");
  if (weights_.defined())
    MT_CHECK(weights_.numel() == values_.numel(), "KeyedJaggedTensor: ", weights_.numel(),
             " weights for ", values_.numel(), " values (expected one weight per value)");
}

void KeyedJaggedTensor::validate_ids(const std::string& key, int64_t num_rows,
                                     const std::string& table) const {
  const int64_t k = key_index(key), B = stride_;
  const int64_t* o = offsets_.data<int64_t>();
  const int64_t* v = values_.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = o[k * B + b]; i < o[k * B + b + 1]; ++i)
      MT_CHECK(v[i] >= 0 && v[i] < num_rows, "KeyedJaggedTensor: id ", v[i], " of key '", key,
               "', sample ", b, " is outside [0, ", num_rows, ")",
               table.empty() ? "" : " of table '", table, table.empty() ? "" : "'");
}

KeyedJaggedTensor KeyedJaggedTensor::permute(const std::vector<int64_t>& indices) const {
  const int64_t B = stride_, K = num_keys();
  const int64_t* o = offsets_.data<int64_t>();
  const int64_t* l = lengths_.data<int64_t>();
  const int64_t* v = values_.data<int64_t>();
  const float* w = weights_.defined() ? weights_.data<float>() : nullptr;
  std::vector<std::string> keys;
  std::vector<int64_t> values, lengths;
  std::vector<float> weights;
  for (int64_t k : indices) {
    MT_CHECK(k >= 0 && k < K, "KeyedJaggedTensor::permute: key index ", k, " outside [0, ", K, ")");
    keys.push_back(keys_[k]);
    values.insert(values.end(), v + o[k * B], v + o[(k + 1) * B]);
    if (w) weights.insert(weights.end(), w + o[k * B], w + o[(k + 1) * B]);
    lengths.insert(lengths.end(), l + k * B, l + (k + 1) * B);
  }
  Tensor wt;
  if (w) {
    wt = Tensor::empty({int64_t(weights.size())});
    std::copy(weights.begin(), weights.end(), wt.data<float>());
  }
  return from_lengths(std::move(keys), i64_tensor(values), i64_tensor(lengths), wt, B);
}

KeyedJaggedTensor KeyedJaggedTensor::select_keys(const std::vector<std::string>& keys) const {
  std::vector<int64_t> idx;
  for (const std::string& k : keys) idx.push_back(key_index(k));
  return permute(idx);
}

std::vector<KeyedJaggedTensor> KeyedJaggedTensor::split(
    const std::vector<int64_t>& segments) const {
  int64_t total = 0;
  for (int64_t s : segments) {
    MT_CHECK(s >= 0, "KeyedJaggedTensor::split: negative segment size ", s);
    total += s;
  }
  MT_CHECK(total == num_keys(), "KeyedJaggedTensor::split: segments ", segments, " sum to ", total,
           " but there are ", num_keys(), " keys");
  std::vector<KeyedJaggedTensor> out;
  int64_t start = 0;
  for (int64_t s : segments) {
    std::vector<int64_t> idx(static_cast<size_t>(s));
    for (int64_t i = 0; i < s; ++i) idx[i] = start + i;
    out.push_back(permute(idx));
    start += s;
  }
  return out;
}

std::ostream& operator<<(std::ostream& os, const KeyedJaggedTensor& kjt) {
  os << "KeyedJaggedTensor(keys=";
  detail::put(os, kjt.keys());
  os << ", stride=" << kjt.stride() << ", values=" << kjt.num_values()
     << (kjt.has_weights() ? ", weighted" : "") << ")";
  return os;
}

}  // namespace mt::runtime::sparse
