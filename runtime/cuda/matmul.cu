// CUDA matmul through cuBLASLt: f32 (strict f32 arithmetic), f64, and bf16/f16 operands with f32
// accumulation, on the operands' own strides (transposed views need no copy). Batches become one
// GEMM when they fold into rows (x[B.., M, K] @ W), a strided-batched GEMM when each operand's
// batch has one stride, and a loop of GEMMs otherwise. The algorithm chosen by cuBLASLt's
// heuristic is cached per shape, layout, dtype and pointer alignment; where it has none, the
// classic cuBLAS strided-batched GEMM runs the same problem.
#include <algorithm>
#include <climits>
#include <optional>

#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/plan_cache.cuh"
#include "runtime/kernels/matmul.h"
#include "runtime/kernels/matmul_layout.h"

namespace mt::runtime::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

using Operand = MatrixLayout;

Tensor blas_ready(const Tensor& t, Operand* op) {
  if (auto l = matrix_layout(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1))) {
    *op = *l;
    return t;
  }
  Tensor c = t.contiguous();
  *op = *matrix_layout(c.size(-2), c.size(-1), c.stride(-2), c.stride(-1));
  return c;
}

struct Types {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

Types types_of(DType t) {
  switch (t) {
    case DType::F32:
      return {CUDA_R_32F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::F64:
      return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::BF16:
      return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::F16:
      return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default:
      MT_FAIL("matmul: expected floating operands, got ", dtype_name(t));
  }
}

// One GEMM problem in cuBLAS's column-major terms: C[m, n] = op(A)[m, k] op(B)[k, n], batched.
struct Gemm {
  DType dtype;
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb, ldc;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  int align = 16;  // smallest alignment (bytes, up to 16) of the three pointers

  bool operator==(const Gemm&) const = default;
};

struct GemmHash {
  size_t operator()(const Gemm& g) const {
    size_t h = size_t(g.dtype) * 31 + size_t(g.trans_a) * 7 + size_t(g.trans_b) * 3;
    for (int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.batch, g.stride_a, g.stride_b,
                      g.stride_c, int64_t(g.align)})
      h = h * 1000003u ^ size_t(v);
    return h;
  }
};

// Descriptors and the heuristic's algorithm for one problem, built once. lt = false when
// cuBLASLt offers no algorithm (some layouts or alignments): the classic cuBLAS call runs instead.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool lt = true;
};

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch == 1) return;
  const int count = int(batch);
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                   sizeof(count)));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                   &stride, sizeof(stride)));
}

Plan make_plan(const Gemm& g) {
  const Types t = types_of(g.dtype);
  Plan p;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, t.compute, t.scale));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, t.data, g.trans_a ? g.k : g.m,
                                             g.trans_a ? g.m : g.k, g.lda));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, t.data, g.trans_b ? g.n : g.k,
                                             g.trans_b ? g.k : g.n, g.ldb));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, t.data, g.m, g.n, g.ldc));
  set_batch(p.a, g.batch, g.stride_a);
  set_batch(p.b, g.batch, g.stride_b);
  set_batch(p.c, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align = uint32_t(g.align);
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  if (g.dtype == DType::BF16 || g.dtype == DType::F16) {
    // Split-K partial sums in f32 only: the default also allows summing them in the output type
    // (bf16), which loses the f32 accumulation exactly where K is long (weight gradients, K =
    // the tokens of the batch).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // No algorithm is either NOT_SUPPORTED or SUCCESS with found == 0, depending on the case.
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle(), p.op, p.a, p.b, p.c,
                                                           p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    p.lt = false;
    return p;
  }
  p.algo = result.algo;
  return p;
}

const Plan& plan_for(const Gemm& g) {
  return cached_plan<Plan, Gemm, GemmHash>(g, make_plan);
}

void run_gemm(const Gemm& g, const void* a, const void* b, void* c) {
  const Plan& p = plan_for(g);
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.0f, zero_f = 0.0f;
  const bool f64 = g.dtype == DType::F64;
  if (!p.lt) {
    const Types t = types_of(g.dtype);
    MT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
        cublas_handle(), g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
        g.m, g.n, g.k, f64 ? (const void*)&one_d : &one_f, a, t.data, g.lda, g.stride_a, b, t.data,
        g.ldb, g.stride_b, f64 ? (const void*)&zero_d : &zero_f, c, t.data, g.ldc, g.stride_c,
        g.batch, t.compute, CUBLAS_GEMM_DEFAULT));
    return;
  }
  MT_CUBLAS_CHECK(cublasLtMatmul(cublaslt_handle(), p.op, f64 ? (const void*)&one_d : &one_f, a,
                                 p.a, b, p.b, f64 ? (const void*)&zero_d : &zero_f, c, p.c, c, p.c,
                                 &p.algo, workspace(kWorkspaceBytes), kWorkspaceBytes,
                                 current_stream()));
}

int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && v % uintptr_t(a) != 0) a /= 2;
  return a;
}

// The one stride that walks a flattened batch, if there is one (0 for a broadcast operand).
std::optional<int64_t> uniform_batch_stride(const Shape& batch, const Shape& bs) {
  std::optional<int64_t> inner;
  int64_t expect = -1;
  for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
    if (batch[d] == 1) continue;
    if (!inner) {
      inner = bs[d];
      expect = bs[d] * batch[d];
      continue;
    }
    if (bs[d] != expect) return std::nullopt;
    expect *= batch[d];
  }
  return inner.value_or(0);
}

void cuda_matmul(const Tensor& a_in, const Tensor& b_in, Tensor& out) {
  check_on_current_device(a_in, "matmul");
  check_on_current_device(b_in, "matmul");
  check_on_current_device(out, "matmul");
  const int64_t M = out.size(-2), N = out.size(-1), K = a_in.size(-1);
  if (out.numel() == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  Operand la{}, lb{};
  const Tensor a = blas_ready(a_in, &la);
  const Tensor b = blas_ready(b_in, &lb);
  const Shape batch(out.shape().begin(), out.shape().end() - 2);
  const Shape a_bs = broadcast_strides(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(a.strides().begin(), a.strides().end() - 2), batch);
  const Shape b_bs = broadcast_strides(Shape(b.shape().begin(), b.shape().end() - 2),
                                       Shape(b.strides().begin(), b.strides().end() - 2), batch);
  const int64_t nb = numel_of(batch);
  const size_t es = out.element_size();
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* pc = static_cast<char*>(out.data_ptr());

  // Row-major C[M, N] = A[M, K] B[K, N] is column-major C^T[N, M] = B^T[N, K] A^T[K, M]: cuBLAS's
  // first operand is our b, its second our a.
  Gemm g{out.dtype(), lb.trans, la.trans, N, M, K, lb.ld, la.ld, N};
  g.align = std::min({alignment(pa), alignment(pb), alignment(pc)});
  bool b_shared = true;
  for (int64_t s : b_bs) b_shared &= s == 0;
  // cuBLASLt supports rows and columns in int32 range only: larger folds go batched.
  if (nb == 1 || (b_shared && !la.trans && nb * M <= INT_MAX &&
                  batch_folds_into_rows(batch, a_bs, M, la.ld))) {
    g.n = nb * M;  // the batch folded into rows of a (and of out)
    run_gemm(g, pb, pa, pc);
    return;
  }
  const auto sa = uniform_batch_stride(batch, a_bs), sb = uniform_batch_stride(batch, b_bs);
  if (sa && sb && nb <= INT_MAX) {
    g.batch = nb;
    g.stride_a = *sb;
    g.stride_b = *sa;
    g.stride_c = M * N;
    run_gemm(g, pb, pa, pc);
    return;
  }
  for (int64_t i = 0; i < nb; ++i) {
    int64_t oa = 0, ob = 0, rem = i;
    for (int64_t d = int64_t(batch.size()) - 1; d >= 0; --d) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += idx * a_bs[d];
      ob += idx * b_bs[d];
    }
    Gemm gi = g;
    gi.align = std::min(
        {alignment(pa + oa * es), alignment(pb + ob * es), alignment(pc + i * M * N * es)});
    run_gemm(gi, pb + ob * es, pa + oa * es, pc + i * M * N * es);
  }
}

MT_REGISTER_KERNEL(matmul_kernel, DeviceType::CUDA, cuda_matmul);

}  // namespace
}  // namespace mt::runtime::cuda
