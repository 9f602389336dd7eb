// CPU grouped_mm: one OpenBLAS GEMM per group; bf16/f16 through f32.
//
// Threading: OpenBLAS runs a GEMM of at most kSmallGemm multiply-adds on one thread, so groups
// that small run concurrently on OpenMP threads (one group per thread at a time); larger groups
// run one after another, each threaded by OpenBLAS itself. Every output element is written by
// exactly one GEMM, so results do not depend on the thread count.
#include "runtime/kernels/grouped_matmul.h"

#include <omp.h>

#include "runtime/cpu/blas.h"

namespace mt::runtime::cpu {
namespace {

// OpenBLAS 0.3's single-thread bound for GEMM (SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD).
constexpr double kSmallGemm = 65536.0 * 4.0;

// Runs job(g) for every group: small ones on OpenMP threads, the others in order.
template <class Job>
void for_each_group(const std::vector<int64_t>& counts, double flops_per_row, Job&& job) {
  const int64_t groups = int64_t(counts.size());
  std::vector<int64_t> small, large;
  for (int64_t g = 0; g < groups; ++g) {
    (double(counts[size_t(g)]) * flops_per_row <= kSmallGemm ? small : large).push_back(g);
  }
  const int64_t ns = int64_t(small.size());
  if (ns > 1 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < ns; ++i) job(small[size_t(i)]);
  } else {
    for (int64_t g : small) job(g);
  }
  for (int64_t g : large) job(g);
}

template <class T>
void grouped_mm_blas(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                     bool transpose_w, Tensor& out) {
  const int64_t K = x.size(1), M = out.size(1);
  if (out.numel() == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t g = 1; g < counts.size(); ++g) offsets[g] = offsets[g - 1] + counts[g - 1];
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  T* po = out.data<T>();
  const int m = blas_int(M, "grouped_mm"), k = blas_int(K, "grouped_mm");
  blas_int(x.size(0), "grouped_mm");  // checked here: no exception may leave the OpenMP region
  for_each_group(counts, double(M) * double(K), [&](int64_t g) {
    const int64_t rows = counts[size_t(g)];
    if (rows == 0) return;
    const int64_t o = offsets[size_t(g)];
    gemm(CblasNoTrans, transpose_w ? CblasTrans : CblasNoTrans, blas_int(rows, "grouped_mm"), m, k,
         px + o * K, k, pw + g * M * K, transpose_w ? k : m, po + o * M, m);
  });
}

template <class T>
void grouped_mm_tn_blas(const Tensor& a, const Tensor& b, const std::vector<int64_t>& counts,
                        Tensor& out) {
  const int64_t P = a.size(1), Q = b.size(1);
  if (out.numel() == 0) return;
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t g = 1; g < counts.size(); ++g) offsets[g] = offsets[g - 1] + counts[g - 1];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int p = blas_int(P, "grouped_mm"), q = blas_int(Q, "grouped_mm");
  blas_int(a.size(0), "grouped_mm");
  for_each_group(counts, double(P) * double(Q), [&](int64_t g) {
    const int64_t rows = counts[size_t(g)];
    T* dst = po + g * P * Q;
    if (rows == 0) {
      for (int64_t i = 0; i < P * Q; ++i) dst[i] = T(0);
      return;
    }
    const int64_t o = offsets[size_t(g)];
    gemm(CblasTrans, CblasNoTrans, p, q, blas_int(rows, "grouped_mm"), pa + o * P, p, pb + o * Q, q,
         dst, q);
  });
}

void cpu_grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts,
                    bool transpose_w, Tensor& out) {
  switch (out.dtype()) {
    case DType::F32:
      return grouped_mm_blas<float>(x, w, counts, transpose_w, out);
    case DType::F64:
      return grouped_mm_blas<double>(x, w, counts, transpose_w, out);
    case DType::BF16:
    case DType::F16: {
      Tensor out32 = Tensor::empty(out.shape(), out.options().with_dtype(DType::F32));
      grouped_mm_blas<float>(x.to(DType::F32), w.to(DType::F32), counts, transpose_w, out32);
      out.copy_(out32);
      return;
    }
    default:
      MT_FAIL("grouped_mm: expected floating operands, got ", dtype_name(out.dtype()));
  }
}

void cpu_grouped_mm_tn(const Tensor& a, const Tensor& b, const std::vector<int64_t>& counts,
                       Tensor& out) {
  switch (out.dtype()) {
    case DType::F32:
      return grouped_mm_tn_blas<float>(a, b, counts, out);
    case DType::F64:
      return grouped_mm_tn_blas<double>(a, b, counts, out);
    case DType::BF16:
    case DType::F16: {
      Tensor out32 = Tensor::empty(out.shape(), out.options().with_dtype(DType::F32));
      grouped_mm_tn_blas<float>(a.to(DType::F32), b.to(DType::F32), counts, out32);
      out.copy_(out32);
      return;
    }
    default:
      MT_FAIL("grouped_mm_tn: expected floating operands, got ", dtype_name(out.dtype()));
  }
}

}  // namespace

MT_REGISTER_KERNEL(grouped_mm_kernel, DeviceType::CPU, cpu_grouped_mm);
MT_REGISTER_KERNEL(grouped_mm_tn_kernel, DeviceType::CPU, cpu_grouped_mm_tn);

}  // namespace mt::runtime::cpu
