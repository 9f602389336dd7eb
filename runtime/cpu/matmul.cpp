// CPU matmul on the operands' own strides: f32 and bf16 through oneDNN where the CPU has AVX-512
// (onednn_gemm.h), else f32 and f64 through OpenBLAS, with bf16 (and f16) widened to f32.
#include "runtime/kernels/matmul.h"

#include <optional>

#include "runtime/cpu/blas.h"
#include "runtime/cpu/loops.h"
#include "runtime/cpu/onednn_gemm.h"
#include "runtime/kernels/matmul_layout.h"

namespace mt::runtime::cpu {
namespace {

// A MatrixLayout in OpenBLAS's terms.
struct BlasOperand {
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

std::optional<BlasOperand> blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const std::optional<MatrixLayout> l = matrix_layout(rows, cols, rs, cs);
  if (!l) return std::nullopt;
  return BlasOperand{l->trans ? CblasTrans : CblasNoTrans, l->ld};
}

// `t` unchanged when BLAS can read its matrices in place, else a contiguous copy.
Tensor blas_ready(const Tensor& t, BlasOperand* layout) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  if (auto l = blas_layout(rows, cols, t.stride(-2), t.stride(-1))) {
    *layout = *l;
    return t;
  }
  Tensor c = t.contiguous();
  *layout = *blas_layout(rows, cols, c.stride(-2), c.stride(-1));
  return c;
}

// Runs out = a @ b as GEMMs on matrices read in place (or contiguous copies): one GEMM when the
// batch folds into rows or there is none, else one per batch. `gemm(la, pa, lb, pb, pc, m, n, k)`
// computes one [m, n] row-major product (ldc n) and is OpenBLAS or oneDNN.
template <class T, class Gemm>
void batched_matmul(const Tensor& a_in, const Tensor& b_in, Tensor& out, const Gemm& gemm) {
  const int64_t M = out.size(-2), N = out.size(-1), K = a_in.size(-1);
  if (out.numel() == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  BlasOperand la{}, lb{};
  const Tensor a = blas_ready(a_in, &la);
  const Tensor b = blas_ready(b_in, &lb);
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const Shape a_bs = broadcast_strides(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(a.strides().begin(), a.strides().end() - 2), batch);
  const Shape b_bs = broadcast_strides(Shape(b.shape().begin(), b.shape().end() - 2),
                                       Shape(b.strides().begin(), b.strides().end() - 2), batch);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = out.data<T>();
  const int64_t nb = numel_of(batch);

  bool b_shared = true;
  for (int64_t s : b_bs) b_shared &= s == 0;
  if (nb == 1 || (b_shared && la.trans == CblasNoTrans && nb * M <= INT_MAX &&
                  batch_folds_into_rows(batch, a_bs, M, la.ld))) {
    // One GEMM: a single matrix, or x[B.., M, K] @ W[K, N] with the batch folded into rows.
    gemm(la, pa, lb, pb, pc, nb * M, N, K);
    return;
  }
  // One GEMM per batch; the library threads each call itself.
  for (int64_t i = 0; i < nb; ++i) {
    int64_t oa = 0, ob = 0, rem = i;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += idx * a_bs[d];
      ob += idx * b_bs[d];
    }
    gemm(la, pa + oa, lb, pb + ob, pc + i * M * N, M, N, K);
  }
}

template <class T>
void matmul_blas(const Tensor& a, const Tensor& b, Tensor& out) {
  batched_matmul<T>(a, b, out,
                    [](BlasOperand la, const T* pa, BlasOperand lb, const T* pb, T* pc, int64_t m,
                       int64_t n, int64_t k) {
                      gemm(la.trans, lb.trans, blas_int(m, "matmul"), blas_int(n, "matmul"),
                           blas_int(k, "matmul"), pa, blas_int(la.ld, "matmul"), pb,
                           blas_int(lb.ld, "matmul"), pc, int(n));
                    });
}

// A BLAS operand as oneDNN's strided matrix.
GemmOperand onednn_operand(BlasOperand l, const void* p) {
  return l.trans == CblasNoTrans ? GemmOperand{p, l.ld, 1} : GemmOperand{p, 1, l.ld};
}

// T is float or bfloat16; the output has the operands' dtype.
template <class T>
void matmul_onednn(const Tensor& a, const Tensor& b, Tensor& out) {
  batched_matmul<T>(a, b, out,
                    [](BlasOperand la, const T* pa, BlasOperand lb, const T* pb, T* pc, int64_t m,
                       int64_t n, int64_t k) {
                      constexpr DType dtype = dtype_v<T>;
                      onednn_gemm(dtype, m, n, k, onednn_operand(la, pa), onednn_operand(lb, pb),
                                  pc, dtype, n);
                    });
}

void cpu_matmul(const Tensor& a, const Tensor& b, Tensor& out) {
  switch (out.dtype()) {
    case DType::F32:
      return onednn_f32_gemm_enabled() ? matmul_onednn<float>(a, b, out)
                                       : matmul_blas<float>(a, b, out);
    case DType::F64:
      return matmul_blas<double>(a, b, out);
    case DType::BF16:
      if (onednn_bf16_gemm_enabled() && a.dtype() == DType::BF16 && b.dtype() == DType::BF16)
        return matmul_onednn<bfloat16>(a, b, out);
      [[fallthrough]];
    case DType::F16: {
      // Widen, multiply with f32 accumulation, round once into out.
      Tensor out32 = Tensor::empty(out.shape(), out.options().with_dtype(DType::F32));
      cpu_matmul(a.to(DType::F32), b.to(DType::F32), out32);
      out.copy_(out32);
      return;
    }
    default:
      MT_FAIL("matmul: expected floating operands, got ", dtype_name(out.dtype()));
  }
}

}  // namespace

MT_REGISTER_KERNEL(matmul_kernel, DeviceType::CPU, cpu_matmul);

}  // namespace mt::runtime::cpu
