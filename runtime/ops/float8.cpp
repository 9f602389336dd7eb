#include "runtime/ops/float8.h"

#include <mutex>
#include <unordered_map>

#include "runtime/autograd/function.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/float8_amax_notes.h"
#include "runtime/ops/join.h"

namespace mt::runtime {

const char* float8_format_name(Float8Format f) { return f == Float8Format::E4M3 ? "e4m3" : "e5m2"; }

const char* float8_recipe_name(Float8Recipe recipe) {
  return recipe == Float8Recipe::Rowwise ? "rowwise" : "tensorwise";
}

namespace {

TensorOptions codes_options(Device device) {
  return TensorOptions{}.with_dtype(DType::Bool).with_device(device);
}

TensorOptions f32_options(Device device) {
  return TensorOptions{}.with_dtype(DType::F32).with_device(device);
}

void check_codes(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.defined() && t.dim() == 2 && t.dtype() == DType::Bool && t.is_contiguous(),
           op, ": expected ", what, " as contiguous 2-D codes, got ",
           t.defined() ? dtype_name(t.dtype()) : "an undefined tensor",
           t.defined() ? " of shape " : "", t.defined() ? t.shape() : Shape{});
}

// Codes registered for weights (FSDP's float8 all-gather), by the weight's storage id (unique in
// the process: a freed storage's id is never reused).
struct WeightCodes {
  std::mutex mutex;
  std::unordered_map<uint64_t, Float8Tensor> by_storage;
};

WeightCodes& weight_codes() {
  static WeightCodes codes;
  return codes;
}

std::optional<Float8Tensor> registered_weight_codes(const Tensor& weight) {
  WeightCodes& w = weight_codes();
  std::lock_guard lock(w.mutex);
  auto it = w.by_storage.find(weight.storage()->id());
  if (it == w.by_storage.end()) return std::nullopt;
  MT_CHECK(it->second.codes.shape() == weight.shape(), "float8_linear: the codes registered for a ",
           "weight of shape ", weight.shape(), " have shape ", it->second.codes.shape());
  return it->second;
}

}  // namespace

void register_float8_weight_codes(const Tensor& weight, Float8Tensor codes) {
  MT_CHECK(codes.codes.defined() && codes.codes.shape() == weight.shape() &&
               codes.format == Float8Format::E4M3,
           "register_float8_weight_codes: expected e4m3 codes of the weight's shape ",
           weight.shape());
  WeightCodes& w = weight_codes();
  std::lock_guard lock(w.mutex);
  w.by_storage[weight.storage()->id()] = std::move(codes);
}

void unregister_float8_weight_codes(const Tensor& weight) {
  WeightCodes& w = weight_codes();
  std::lock_guard lock(w.mutex);
  w.by_storage.erase(weight.storage()->id());
}

Float8Tensor to_float8(const Tensor& x, Float8Format format, bool rows, bool transposed,
                       const Float8AmaxReduce& reduce) {
  MT_CHECK(x.dim() == 2, "to_float8: expected a 2-D tensor, got shape ", x.shape());
  MT_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
           "to_float8: expected f32 or bf16, got ", dtype_name(x.dtype()));
  const Tensor xc = x.detach().contiguous();
  const Device device = x.device();
  // The amax its producer measured as it wrote x (float8_amax_notes.h), else a pass of its own;
  // a reduction changes it in place, so not the note itself.
  Tensor amax = noted_float8_amax(xc);
  if (!amax.defined()) {
    amax = Tensor::empty({1}, f32_options(device));
    float8_amax_kernel(device, xc, amax);
  } else if (reduce) {
    amax = amax.clone();
  }
  if (reduce) reduce(amax);
  Float8Tensor r;
  r.format = format;
  if (rows) r.codes = Tensor::empty(x.shape(), codes_options(device));
  if (transposed) r.codes_t = Tensor::empty({x.size(1), x.size(0)}, codes_options(device));
  r.scale_inv = Tensor::empty({1}, f32_options(device));
  float8_cast_kernel(device, xc, amax, format, r.codes, r.codes_t, r.scale_inv);
  return r;
}

namespace {
void check_rowwise_input(const Tensor& x, const char* op) {
  MT_CHECK(x.dim() == 2, op, ": expected a 2-D tensor, got shape ", x.shape());
  MT_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, op, ": expected f32 or bf16, got ",
           dtype_name(x.dtype()));
}

// Whether x is the transpose of a contiguous matrix that the device's columnwise kernels read in
// place (the rowwise cast of x is then the columnwise cast of x.transpose(0, 1), no copy).
bool columnwise_in_place(const Tensor& x) {
  return x.stride(0) == 1 && x.stride(1) == x.size(0) && !x.is_contiguous() &&
         float8_colwise_cast_kernel.has(x.device().type) &&
         float8_colwise_amax_kernel.has(x.device().type);
}
}  // namespace

Tensor float8_row_amax(const Tensor& x) {
  check_rowwise_input(x, __func__);
  Tensor row_amax = Tensor::empty({x.size(0)}, f32_options(x.device()));
  const Tensor d = x.detach();
  if (columnwise_in_place(d)) {
    float8_colwise_amax_kernel(x.device(), d.transpose(0, 1), row_amax);
  } else {
    float8_rowwise_amax_kernel(x.device(), d.contiguous(), row_amax);
  }
  return row_amax;
}

Float8Tensor to_float8_rowwise_with_amax(const Tensor& x, Float8Format format, bool power_of_2,
                                         const Tensor& row_amax) {
  check_rowwise_input(x, __func__);
  MT_CHECK(!row_amax.defined() ||
               (row_amax.dtype() == DType::F32 && row_amax.numel() == x.size(0) &&
                row_amax.is_contiguous() && row_amax.device() == x.device()),
           "to_float8_rowwise: expected ", x.size(0), " contiguous f32 row amaxes on ", x.device(),
           ", got ", row_amax.shape());
  Float8Tensor r;
  r.format = format;
  r.codes = Tensor::empty(x.shape(), codes_options(x.device()));
  r.scale_inv = Tensor::empty({x.size(0)}, f32_options(x.device()));
  const Tensor d = x.detach();
  if (columnwise_in_place(d)) {
    float8_colwise_cast_kernel(x.device(), d.transpose(0, 1), row_amax, format, power_of_2,
                               r.codes, r.scale_inv);
  } else {
    float8_rowwise_cast_kernel(x.device(), d.contiguous(), row_amax, format, power_of_2, r.codes,
                               r.scale_inv);
  }
  return r;
}

Tensor float8_rowwise_operand(const Tensor& x) {
  const Tensor d = x.detach();
  return columnwise_in_place(d) ? d : d.contiguous();
}

Float8Tensor to_float8_rowwise(const Tensor& x, Float8Format format, bool power_of_2,
                               const Float8AmaxReduce& reduce) {
  check_rowwise_input(x, __func__);
  const Tensor xc = float8_rowwise_operand(x);
  Tensor row_amax;  // undefined: the cast takes each row's own
  if (reduce) {
    row_amax = float8_row_amax(xc);
    reduce(row_amax);
  }
  return to_float8_rowwise_with_amax(xc, format, power_of_2, row_amax);
}

Tensor float8_transpose(const Tensor& codes) {
  check_codes(codes, __func__, "codes");
  Tensor out = Tensor::empty({codes.size(1), codes.size(0)}, codes_options(codes.device()));
  float8_transpose_kernel(codes.device(), codes, out);
  return out;
}

Tensor float8_dequantize(const Tensor& codes, Float8Format format, const Tensor& scale_inv) {
  check_codes(codes, __func__, "codes");
  MT_CHECK(scale_inv.numel() == 1 || scale_inv.numel() == codes.size(0), "float8_dequantize: ",
           scale_inv.numel(), " scales for ", codes.size(0), " rows (expected 1 or one per row)");
  const Tensor host = codes.to(Device::cpu());
  const Tensor scales = scale_inv.to(Device::cpu()).contiguous();
  const float* s = scales.data<float>();
  const bool per_row = scale_inv.numel() > 1;
  Tensor out = Tensor::empty(codes.shape(), f32_options(Device::cpu()));
  const auto* p = static_cast<const uint8_t*>(host.data_ptr());
  float* o = out.data<float>();
  const int64_t cols = codes.size(1);
  for (int64_t i = 0; i < codes.numel(); ++i)
    o[i] = float8_to_float(p[i], format) * s[per_row ? i / cols : 0];
  return out;
}

Tensor float8_mm(const Tensor& a, Float8Format a_format, const Tensor& a_scale_inv,
                 const Tensor& b, Float8Format b_format, const Tensor& b_scale_inv,
                 DType out_dtype, bool fast_accum) {
  check_codes(a, "float8_mm", "a");
  check_codes(b, "float8_mm", "b");
  MT_CHECK(a.size(1) == b.size(1), "float8_mm: a ", a.shape(), " and b ", b.shape(),
           " differ in K (the product is a @ b^T)");
  MT_CHECK(a.device() == b.device(), "float8_mm: operands on different devices: ", a.device(),
           " and ", b.device());
  MT_CHECK(!(a_format == Float8Format::E5M2 && b_format == Float8Format::E5M2),
           "float8_mm: two e5m2 operands (FP8 GEMMs take at most one)");
  MT_CHECK(out_dtype == DType::F32 || out_dtype == DType::BF16,
           "float8_mm: expected an f32 or bf16 output, got ", dtype_name(out_dtype));
  MT_CHECK(a_scale_inv.dtype() == DType::F32 && b_scale_inv.dtype() == DType::F32 &&
               (a_scale_inv.numel() == 1 || a_scale_inv.numel() == a.size(0)) &&
               (b_scale_inv.numel() == 1 || b_scale_inv.numel() == b.size(0)),
           "float8_mm: expected f32 scales, [1] or one per row: a has ", a.size(0), " rows and ",
           a_scale_inv.numel(), " scales, b ", b.size(0), " rows and ", b_scale_inv.numel());
  Tensor out = Tensor::empty({a.size(0), b.size(0)}, f32_options(a.device()).with_dtype(out_dtype));
  float8_matmul_kernel(a.device(), a, a_format, a_scale_inv, b, b_format, b_scale_inv, fast_accum,
                       out);
  return out;
}

namespace {
// The FP8 GEMMs' rule for a layer's features, checked at every call (the device is checked once,
// at conversion, and again by the GEMM kernel: not a dispatch of its own in every call, which
// the profiler would record).
std::optional<std::string> features_unsupported(int64_t in_features, int64_t out_features) {
  if (in_features % kFloat8GemmMultiple != 0 || out_features % kFloat8GemmMultiple != 0) {
    return "in " + std::to_string(in_features) + " x out " + std::to_string(out_features) +
           " is not a multiple of " + std::to_string(kFloat8GemmMultiple);
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::string> float8_linear_unsupported(Device device, int64_t in_features,
                                                     int64_t out_features) {
  if (auto why = float8_gemm_unsupported_kernel(device)) return why;
  return features_unsupported(in_features, out_features);
}

// The inputs cast in a Float8InputCastSharing scope, each with the view it was cast from and the
// recipe it was cast for.
struct Float8InputCastSharing::Memo {
  struct Entry {
    uint64_t storage = 0, version = 0;
    int64_t offset = 0;
    Shape shape, strides;
    DType dtype = DType::F32;
    Float8Recipe recipe = Float8Recipe::Tensorwise;
    Float8Tensor cast;       // tensorwise: codes (and codes_t); rowwise: by row
    Float8Tensor by_column;  // rowwise: the transpose cast by row, or undefined codes
  };
  std::vector<Entry> entries;

  // The entry of x's view cast for `recipe`, or a new one.
  Entry& of(const Tensor& x, Float8Recipe recipe) {
    for (Entry& e : entries) {
      if (e.storage == x.storage()->id() && e.version == x.version() && e.offset == x.offset() &&
          e.shape == x.shape() && e.strides == x.strides() && e.dtype == x.dtype() &&
          e.recipe == recipe) {
        return e;
      }
    }
    Entry& e = entries.emplace_back();
    e.storage = x.storage()->id();
    e.version = x.version();
    e.offset = x.offset();
    e.shape = x.shape();
    e.strides = x.strides();
    e.dtype = x.dtype();
    e.recipe = recipe;
    return e;
  }
};

namespace {
thread_local Float8InputCastSharing::Memo* t_input_casts = nullptr;
}  // namespace

Float8InputCastSharing::Float8InputCastSharing()
    : previous_(t_input_casts), memo_(std::make_unique<Memo>()) {
  t_input_casts = memo_.get();
}

Float8InputCastSharing::~Float8InputCastSharing() { t_input_casts = previous_; }

namespace {

// x2's e4m3 cast with its rows (and, when `transposed`, its transpose), shared within a
// Float8InputCastSharing scope when no amax reduction applies.
Float8Tensor cast_input(const Tensor& x2, bool transposed, const Float8AmaxReduce& reduce) {
  Float8InputCastSharing::Memo* memo = reduce ? nullptr : t_input_casts;
  if (memo == nullptr) return to_float8(x2, Float8Format::E4M3, true, transposed, reduce);
  Float8InputCastSharing::Memo::Entry& e = memo->of(x2, Float8Recipe::Tensorwise);
  if (!e.cast.codes.defined()) {
    e.cast = to_float8(x2, Float8Format::E4M3, true, transposed);
  } else if (transposed && !e.cast.codes_t.defined()) {
    e.cast.codes_t = float8_transpose(e.cast.codes);
  }
  return e.cast;
}

// The rowwise recipe's casts of x2 [tokens, in] (e4m3, power-of-two scales): by token (the
// forward's; reduced by `reduce` when given) and, when `by_column`, by input feature over the
// tokens (the weight gradient's), shared within a Float8InputCastSharing scope when no amax
// reduction applies.
std::pair<Float8Tensor, Float8Tensor> cast_input_rowwise(const Tensor& x2, bool by_column,
                                                         const Float8AmaxReduce& reduce) {
  constexpr bool pow2 = true;  // torchao's rowwise recipe rounds its scales to powers of two
  const auto column_cast = [&] {
    return to_float8_rowwise(x2.transpose(0, 1), Float8Format::E4M3, pow2);
  };
  Float8InputCastSharing::Memo* memo = reduce ? nullptr : t_input_casts;
  if (memo == nullptr) {
    return {to_float8_rowwise(x2, Float8Format::E4M3, pow2, reduce),
            by_column ? column_cast() : Float8Tensor()};
  }
  Float8InputCastSharing::Memo::Entry& e = memo->of(x2, Float8Recipe::Rowwise);
  if (!e.cast.codes.defined()) e.cast = to_float8_rowwise(x2, Float8Format::E4M3, pow2);
  if (by_column && !e.by_column.codes.defined()) e.by_column = column_cast();
  return {e.cast, by_column ? e.by_column : Float8Tensor()};
}

// The rowwise recipe's y = x2 [tokens, in] @ weight^T, recorded for autograd (see the header).
// reduce / split_dim: tensor parallelism's, for the operands whose contracted dim is split.
Tensor float8_linear_rowwise(const Tensor& x, const Tensor& x2, const Tensor& weight,
                             int64_t tokens, int64_t out, bool need_dx, bool need_dw,
                             const Float8AmaxReduce& reduce, int64_t split_dim) {
  constexpr Float8Format e4m3 = Float8Format::E4M3;
  constexpr bool pow2 = true;  // torchao's rowwise recipe rounds its scales to powers of two
  MT_CHECK(!registered_weight_codes(weight), "float8_linear: the rowwise recipe casts the weight ",
           "per output feature, but FSDP gathered it as tensorwise codes (float8 all-gather is ",
           "tensorwise only)");
  MT_CHECK(!reduce || split_dim == 0 || split_dim == 1, "float8_linear: the rowwise recipe with ",
           "reduced amaxes needs the weight's split dim (0 or 1), got ", split_dim);
  const Float8AmaxReduce forward_reduce = split_dim == 1 ? reduce : nullptr;  // K = in, split
  const Float8AmaxReduce dx_reduce = split_dim == 0 ? reduce : nullptr;       // K = out, split
  const Tensor w = weight.detach();
  // x by token (forward) and by input feature over the tokens (for dW), W by output feature.
  const auto [xq, xt] = cast_input_rowwise(x2, need_dw, forward_reduce);
  const Float8Tensor wq = to_float8_rowwise(w, e4m3, pow2, forward_reduce);
  Tensor y = float8_mm(xq.codes, e4m3, xq.scale_inv, wq.codes, e4m3, wq.scale_inv, x.dtype(),
                       /*fast_accum=*/true);
  if (!need_dx && !need_dw) return y;
  // W by input feature over the outputs (for dx).
  Float8Tensor wt;
  if (need_dx) wt = to_float8_rowwise(w.transpose(0, 1), e4m3, pow2, dx_reduce);
  autograd::record(
      "float8_linear", {x, weight}, {y},
      [xt, wt, x_shape = x.shape(), dtype = x.dtype(), tokens, out,
       dx_reduce](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
        const Tensor g = args.grad(0).reshape({tokens, out}).contiguous();
        Tensor dx, dw;
        if (args.needs(0)) {
          const Float8Tensor gq = to_float8_rowwise(g, e4m3, pow2, dx_reduce);
          dx = float8_mm(gq.codes, e4m3, gq.scale_inv, wt.codes, e4m3, wt.scale_inv, dtype,
                         /*fast_accum=*/false)
                   .reshape(x_shape);
        }
        if (args.needs(1)) {
          const Float8Tensor gt = to_float8_rowwise(g.transpose(0, 1), e4m3, pow2);
          dw = float8_mm(gt.codes, e4m3, gt.scale_inv, xt.codes, e4m3, xt.scale_inv, dtype,
                         /*fast_accum=*/false);
        }
        return {dx, dw};
      });
  return y;
}

// The tensorwise recipe's y = x2 [tokens, in] @ weight^T, recorded for autograd (see the header).
Tensor float8_linear_tensorwise(const Tensor& x, const Tensor& x2, const Tensor& weight,
                                int64_t tokens, int64_t out, bool need_dx, bool need_dw,
                                const Float8AmaxReduce& reduce) {
  const Float8Tensor xq = cast_input(x2, need_dw, reduce);
  Float8Tensor wq;
  if (auto gathered = registered_weight_codes(weight)) {
    // FSDP gathered the weight in FP8, scaled by the whole weight's amax (with tensor
    // parallelism, reduced over the tp ranks as `reduce` would).
    wq = std::move(*gathered);
    if (need_dx) wq.codes_t = float8_transpose(wq.codes);
  } else {
    wq = to_float8(weight.detach(), Float8Format::E4M3, true, need_dx, reduce);
  }
  const Tensor y = float8_mm(xq.codes, xq.format, xq.scale_inv, wq.codes, wq.format,
                             wq.scale_inv, x.dtype(), /*fast_accum=*/true);
  if (need_dx || need_dw) {
    // Backward keeps the transposed codes only: dx = dy @ W, dW = dy^T @ x.
    autograd::record(
        "float8_linear", {x, weight}, {y},
        [x_t = xq.codes_t, x_scale_inv = xq.scale_inv, w_t = wq.codes_t,
         w_scale_inv = wq.scale_inv, x_shape = x.shape(), dtype = x.dtype(), tokens, out,
         reduce](const autograd::BackwardArgs& args) -> std::vector<Tensor> {
          const Tensor g = args.grad(0).reshape({tokens, out}).contiguous();
          const Float8Tensor gq =
              to_float8(g, Float8Format::E5M2, args.needs(0), args.needs(1), reduce);
          Tensor dx, dw;
          if (args.needs(0)) {
            dx = float8_mm(gq.codes, gq.format, gq.scale_inv, w_t, Float8Format::E4M3, w_scale_inv,
                           dtype, /*fast_accum=*/false)
                     .reshape(x_shape);
          }
          if (args.needs(1)) {
            dw = float8_mm(gq.codes_t, gq.format, gq.scale_inv, x_t, Float8Format::E4M3,
                           x_scale_inv, dtype, /*fast_accum=*/false);
          }
          return {dx, dw};
        });
  }
  return y;
}

}  // namespace

Tensor float8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
                     Float8Recipe recipe, const Float8AmaxReduce& reduce_amax, int64_t split_dim) {
  MT_CHECK(weight.dim() == 2, "float8_linear: expected a 2-D weight [out, in], got shape ",
           weight.shape());
  MT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "float8_linear: input ", x.shape(),
           " does not end in the weight's in_features ", weight.size(1));
  MT_CHECK(x.dtype() == weight.dtype() && (x.dtype() == DType::F32 || x.dtype() == DType::BF16),
           "float8_linear: expected an f32 or bf16 input and weight of one dtype, got ",
           dtype_name(x.dtype()), " and ", dtype_name(weight.dtype()));
  const int64_t in = weight.size(1), out = weight.size(0);
  const int64_t tokens = x.numel() / in;
  if (auto why = features_unsupported(in, out)) {
    MT_FAIL("float8_linear: cannot run x ", x.shape(), " @ weight ", weight.shape(), "^T in FP8: ",
            *why);
  }
  if (tokens % kFloat8GemmMultiple != 0) {
    // Zero rows up to the next multiple (a generation step, an odd batch): they change neither
    // the scales nor the other rows (and tensorwise still does not read a weight FSDP gathered as
    // codes).
    Tensor padded = cat({x.reshape({tokens, in}),
                         zeros({kFloat8GemmMultiple - tokens % kFloat8GemmMultiple, in}, x.options())},
                        0);
    Shape out_shape = x.shape();
    out_shape.back() = out;
    return float8_linear(padded, weight, bias, recipe, reduce_amax, split_dim)
        .narrow(0, 0, tokens)
        .reshape(out_shape);
  }
  const bool need_dx = autograd::any_requires_grad({x});
  const bool need_dw = autograd::any_requires_grad({weight});
  const Tensor x2 = x.detach().reshape({tokens, in});
  Tensor y = recipe == Float8Recipe::Rowwise
                 ? float8_linear_rowwise(x, x2, weight, tokens, out, need_dx, need_dw,
                                         reduce_amax, split_dim)
                 : float8_linear_tensorwise(x, x2, weight, tokens, out, need_dx, need_dw,
                                            reduce_amax);
  if (bias.defined()) {
    MT_CHECK(bias.dim() == 1 && bias.size(0) == out, "float8_linear: expected a bias of shape [",
             out, "], got ", bias.shape());
    y = add(y, bias);
  }
  Shape out_shape = x.shape();
  out_shape.back() = out;
  return y.reshape(out_shape);
}

}  // namespace mt::runtime
