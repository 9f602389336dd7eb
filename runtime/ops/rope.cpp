#include "runtime/ops/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "runtime/autograd/function.h"
#include "runtime/kernels/rope.h"
#include "runtime/ops/factory.h"

namespace mt::runtime {

namespace {

double scale_frequency(double freq, const RopeScaling& s) {
  const double orig = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = orig / s.low_freq_factor;
  const double high_freq_wavelen = orig / s.high_freq_factor;
  const double wavelen = 2.0 * std::numbers::pi / freq;
  if (wavelen < high_freq_wavelen) return freq;
  if (wavelen > low_freq_wavelen) return freq / s.factor;
  const double smooth =
      (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * freq / s.factor + smooth * freq;
}

}  // namespace

RopeTables rope_frequencies(int64_t head_dim, int64_t max_seq_len, double theta,
                            std::optional<RopeScaling> scaling) {
  MT_CHECK(head_dim > 0 && head_dim % 2 == 0,
           "rope_frequencies: expected a positive even head_dim, got ", head_dim);
  MT_CHECK(max_seq_len >= 0, "rope_frequencies: expected max_seq_len >= 0, got ", max_seq_len);
  MT_CHECK(std::isfinite(theta) && theta > 0, "rope_frequencies: expected theta > 0, got ", theta);
  if (scaling) {
    MT_CHECK(scaling->factor > 0 && scaling->low_freq_factor > 0 &&
                 scaling->high_freq_factor > scaling->low_freq_factor &&
                 scaling->original_max_position_embeddings > 0,
             "rope_frequencies: expected scaling with factor > 0, 0 < low_freq_factor < "
             "high_freq_factor and original_max_position_embeddings > 0, got factor ",
             scaling->factor, ", low_freq_factor ", scaling->low_freq_factor, ", high_freq_factor ",
             scaling->high_freq_factor, ", original_max_position_embeddings ",
             scaling->original_max_position_embeddings);
  }
  const int64_t half = head_dim / 2;
  std::vector<double> freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    freqs[i] = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
    if (scaling) freqs[i] = scale_frequency(freqs[i], *scaling);
  }
  std::vector<double> c(static_cast<size_t>(max_seq_len * half)), s(c.size());
  for (int64_t p = 0; p < max_seq_len; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * freqs[i];
      c[p * half + i] = std::cos(angle);
      s[p * half + i] = std::sin(angle);
    }
  }
  const TensorOptions f32 = TensorOptions{}.with_dtype(DType::F32);
  return {from_vector<double>(c, {max_seq_len, half}, f32),
          from_vector<double>(s, {max_seq_len, half}, f32)};
}

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, int64_t position_offset) {
  MT_CHECK(x.defined() && cos.defined() && sin.defined(),
           "apply_rope: x, cos and sin must be defined tensors");
  MT_CHECK(x.dim() == 4, "apply_rope: expected x of shape [B, T, H, head_dim], got shape ",
           x.shape());
  const int64_t seq = x.shape()[1], head_dim = x.shape()[3];
  MT_CHECK(head_dim % 2 == 0, "apply_rope: expected an even head_dim, got x of shape ", x.shape());
  MT_CHECK(cos.dim() == 2 && cos.shape() == sin.shape() && cos.shape()[1] == head_dim / 2,
           "apply_rope: expected cos and sin of shape [max_seq_len, ", head_dim / 2,
           "] for x of shape ", x.shape(), ", got ", cos.shape(), " and ", sin.shape());
  MT_CHECK(position_offset >= 0 && position_offset + seq <= cos.shape()[0],
           "apply_rope: positions [", position_offset, ", ", position_offset + seq,
           ") exceed the tables' max_seq_len ", cos.shape()[0], " (x of shape ", x.shape(), ")");
  MT_CHECK(x.is_floating_point() && cos.is_floating_point() && sin.is_floating_point(),
           "apply_rope: expected floating tensors, got x ", x.dtype(), ", cos ", cos.dtype(),
           ", sin ", sin.dtype());
  MT_CHECK(x.device() == cos.device() && x.device() == sin.device(), "apply_rope: x is on ",
           x.device(), " but cos/sin on ", cos.device(), "/", sin.device());

  const DType table_dtype = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  // Read where it is when its tokens are evenly spaced rows (a joined q/k/v projection's columns).
  const Tensor xc = rope_reads_in_place(x) ? x.detach() : x.detach().contiguous();
  const Tensor cc = cos.detach().to(table_dtype).contiguous();
  const Tensor sc = sin.detach().to(table_dtype).contiguous();
  Tensor out = empty(x.shape(), x.options());
  rope_kernel(x.device(), xc, cc, sc, position_offset, /*inverse=*/false, out);

  if (autograd::any_requires_grad({x})) {
    autograd::record(
        "apply_rope", {x}, {out},
        [scos = autograd::SavedTensor(cc), ssin = autograd::SavedTensor(sc), position_offset,
         dtype = x.dtype()](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          const Tensor dy = args.grad(0).to(dtype).contiguous();
          Tensor dx = empty(dy.shape(), dy.options());
          rope_kernel(dy.device(), dy, scos.get(), ssin.get(), position_offset,
                      /*inverse=*/true, dx);
          return {dx};
        });
  }
  return out;
}

}  // namespace mt::runtime
