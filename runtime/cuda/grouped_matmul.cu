// CUDA grouped_mm (the op is runtime/ops/grouped_matmul.h): one cuBLAS GEMM per non-empty group
// on the compute stream, f32 (strict f32 arithmetic), f64, and bf16/f16 with f32 accumulation.
// The row counts are host values that change every step (MoE routing), so the classic cuBLAS
// entry point is used: it needs no per-shape plan, unlike cuBLASLt's cached ones in matmul.cu.
// Every output element is written by exactly one GEMM.
#include <climits>

#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/grouped_matmul.h"

namespace mt::runtime::cuda {
namespace {

struct GemmTypes {
  cudaDataType_t data;
  cublasComputeType_t compute;
};

GemmTypes gemm_types(DType t) {
  switch (t) {
    case DType::F32:
      return {CUDA_R_32F, CUBLAS_COMPUTE_32F};
    case DType::F64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F};
    case DType::BF16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
    case DType::F16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F};
    default:
      MT_FAIL("grouped_mm: expected floating operands, got ", dtype_name(t));
  }
}

int gemm_dim(int64_t v) {
  MT_CHECK(v <= INT_MAX, "grouped_mm: dimension ", v, " exceeds cuBLAS's int range");
  return int(v);
}

// Column-major C[m, n] = op(A)[m, k] op(B)[k, n] with alpha = 1, beta = 0 (C is only written).
void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a,
          int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc) {
  const GemmTypes t = gemm_types(dtype);
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool f64 = dtype == DType::F64;
  MT_CUBLAS_CHECK(cublasGemmEx(
      cublas_handle(), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      gemm_dim(m), gemm_dim(n), gemm_dim(k), f64 ? (const void*)&one_d : &one_f, a, t.data,
      gemm_dim(lda), b, t.data, gemm_dim(ldb), f64 ? (const void*)&zero_d : &zero_f, c, t.data,
      gemm_dim(ldc), t.compute, CUBLAS_GEMM_DEFAULT));
}

std::vector<int64_t> group_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t g = 1; g < counts.size(); ++g) offsets[g] = offsets[g - 1] + counts[g - 1];
  return offsets;
}

// out_g [rows, M] = x_g [rows, K] @ w[g]^T (w[g] [M, K]) or x_g @ w[g] (w[g] [K, M]). In cuBLAS's
// column-major terms: out_g^T [M, rows] = op(w[g]) [M, K] @ x_g^T [K, rows].
void cuda_grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                     bool transpose_w, Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &w, &out})
    check_on_current_device(*t, "grouped_mm");
  const int64_t K = x.size(1), M = out.size(1);
  if (out.numel() == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  const std::vector<int64_t> offsets = group_offsets(counts);
  const size_t es = out.element_size();
  const char* px = static_cast<const char*>(x.data_ptr());
  const char* pw = static_cast<const char*>(w.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t rows = counts[g];
    if (rows == 0) continue;
    const int64_t o = offsets[g];
    gemm(out.dtype(), transpose_w, false, M, rows, K, pw + int64_t(g) * M * K * es,
         transpose_w ? K : M, px + o * K * es, K, po + o * M * es, M);
  }
}

// out[g] [P, Q] = a_g^T [P, rows] @ b_g [rows, Q]. Column-major: out[g]^T [Q, P] = b_g^T [Q, rows]
// @ a_g [rows, P], where b_g is read as [Q, rows] (ld Q) and a_g as [P, rows] transposed (ld P).
void cuda_grouped_mm_tn(const Tensor& a, const Tensor& b, const std::vector<int64_t>& counts,
                        Tensor& out) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &out})
    check_on_current_device(*t, "grouped_mm");
  const int64_t P = a.size(1), Q = b.size(1);
  if (out.numel() == 0) return;
  const std::vector<int64_t> offsets = group_offsets(counts);
  const size_t es = out.element_size();
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  for (size_t g = 0; g < counts.size(); ++g) {
    char* dst = po + int64_t(g) * P * Q * es;
    const int64_t rows = counts[g];
    if (rows == 0) {  // an empty sum: zeros (cuBLAS is not asked to scale by beta = 0 with k = 0)
      MT_CUDA_CHECK(cudaMemsetAsync(dst, 0, size_t(P * Q) * es, current_stream()));
      continue;
    }
    const int64_t o = offsets[g];
    gemm(out.dtype(), false, true, Q, P, rows, pb + o * Q * es, Q, pa + o * P * es, P, dst, Q);
  }
}

}  // namespace

MT_REGISTER_KERNEL(grouped_mm_kernel, DeviceType::CUDA, cuda_grouped_mm);
MT_REGISTER_KERNEL(grouped_mm_tn_kernel, DeviceType::CUDA, cuda_grouped_mm_tn);

}  // namespace mt::runtime::cuda
