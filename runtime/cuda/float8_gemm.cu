// The scaled FP8 GEMM of float8 training through cuBLASLt (FP8 tensor cores, compute capability
// 8.9+): tensorwise, cuBLASLt applies both scales; rowwise (a scale per row of each operand), its
// epilogue applies them (outer-vector scale mode) where this cuBLASLt and GPU have the mode and it
// gave the exact answer on a check GEMM, otherwise a second kernel scales the GEMM's f32 sums.
// Tested against the CPU reference (runtime/cpu/float8.cpp) within f32 accumulation.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/cuda/float8.cuh"
#include "runtime/cuda/float8_gemm.h"
#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/plan_cache.cuh"
#include "runtime/kernels/float8.h"
#include "runtime/ops/factory.h"

namespace mt::runtime::cuda {
namespace {

std::optional<std::string> cuda_float8_gemm_unsupported() {
  const cudaDeviceProp& p = device_properties(current_device());
  if (p.major * 10 + p.minor >= 89) return std::nullopt;
  return std::string(p.name) + " has compute capability " + std::to_string(p.major) + "." +
         std::to_string(p.minor) + "; FP8 tensor cores need 8.9 (Ada) or newer";
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct Problem {
  int64_t m, n, k;
  Float8Format a_format, b_format;
  DType out;
  bool fast_accum;
  bool outer_vec = false;  // per-row scale vectors for both operands, applied by cuBLASLt
  bool operator==(const Problem&) const = default;
};

struct ProblemHash {
  size_t operator()(const Problem& p) const {
    size_t h = size_t(p.a_format) * 7 + size_t(p.b_format) * 3 + size_t(p.out) * 11 +
               size_t(p.fast_accum) + size_t(p.outer_vec) * 13;
    for (int64_t v : {p.m, p.n, p.k}) h = h * 1000003u ^ size_t(v);
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = true;  // false: no algorithm (only an outer_vec problem may lack one)
  std::string why_not_found;  // cuBLASLt's reason when !found
};

cudaDataType_t fp8_type(Float8Format f) {
  return f == Float8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// Row-major out[M, N] = a[M, K] b[N, K]^T is column-major out^T[N, M] = op(B1) B2 with cuBLAS's
// first operand our b (stored K x N column-major, ld K, transposed) and its second our a (K x M,
// ld K, not transposed): the "TN" layout FP8 GEMMs require. Scale pointers are set per call;
// the algorithm search needs some set already (it refuses a vector scale mode without one, and
// may pick a kernel that ignores scales otherwise), so it sees a placeholder's.
Plan make_plan(const Problem& p) {
  Plan plan;
  MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  MT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const int8_t fast = p.fast_accum ? 1 : 0;
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                 sizeof(fast)));
  if (p.outer_vec) {
#if CUBLAS_VERSION >= 120900
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    for (auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE}) {
      const cublasStatus_t st = cublasLtMatmulDescSetAttribute(plan.op, attr, &mode, sizeof(mode));
      if (st != CUBLAS_STATUS_SUCCESS) {  // a cuBLASLt at run time older than the headers
        plan.found = false;
        plan.why_not_found = std::string("setting the scale mode: ") + cublasGetStatusString(st);
        return plan;
      }
    }
#else
    plan.found = false;
    plan.why_not_found = "this build's cuBLASLt has no outer-vector scale mode";
    return plan;
#endif
  }
  // Placeholder scales (as many as either operand has rows) for the search, freed after it.
  const Tensor placeholder = Tensor::empty(
      {std::max(p.m, p.n)},
      TensorOptions{}.with_dtype(DType::F32).with_device(Device::cuda(current_device())));
  const void* scale = placeholder.data_ptr();
  for (auto attr : {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER}) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, attr, &scale, sizeof(scale)));
  }
  const cudaDataType_t out = p.out == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, fp8_type(p.b_format), p.k, p.n, p.k));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, fp8_type(p.a_format), p.k, p.m, p.k));
  MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, out, p.n, p.m, p.n));

  cublasLtMatmulPreference_t pref = nullptr;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      cublaslt_handle(), plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (p.outer_vec &&
      !(st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS)) {
    plan.found = false;  // not on this GPU: the caller scales in a second kernel
    plan.why_not_found = std::string("no algorithm with outer-vector scales (") +
                         cublasGetStatusString(st != CUBLAS_STATUS_SUCCESS ? st : result.state) +
                         (found > 0 ? ")" : ", none found)");
    return plan;
  }
  MT_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS,
           "float8_matmul: cuBLASLt has no FP8 algorithm for [", p.m, ", ", p.k, "] @ [", p.n, ", ",
           p.k, "]^T (", float8_format_name(p.a_format), " x ", float8_format_name(p.b_format),
           " -> ", dtype_name(p.out), "): ", cublasGetStatusString(st));
  plan.algo = result.algo;
  return plan;
}

const Plan& plan_for(const Problem& p) {
  return cached_plan<Plan, Problem, ProblemHash>(p, make_plan);
}

// out[i][j] = sums[i][j] * (a_scale_inv[i or 0] * b_scale_inv[j or 0]): rowwise scales applied to
// the f32 sums of an unscaled FP8 GEMM (as the CPU reference applies them).
template <class T>
__global__ void scale_rows_cols_kernel(const float* sums, int64_t m, int64_t n,
                                       const float* a_scale_inv, bool a_rows,
                                       const float* b_scale_inv, bool b_rows, T* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * n; e += stride) {
    const int64_t i = e / n, j = e % n;
    const float scale = a_scale_inv[a_rows ? i : 0] * b_scale_inv[b_rows ? j : 0];
    out[e] = T(sums[e] * scale);
  }
}

// Launches the cuBLASLt FP8 GEMM of plan `p` into out (f32 or bf16) with the two scale pointers;
// cuBLASLt's status (it may reject a combination only at the call, e.g. outer-vector scales).
cublasStatus_t try_launch_gemm(const Problem& p, const Tensor& a, const Tensor& b,
                               const void* a_scale, const void* b_scale, const Tensor& out) {
  const Plan& plan = plan_for(p);
  // Scales are per call (device pointers: no host synchronisation); the descriptor is shared, so
  // setting them and launching happen under one lock.
  static std::mutex launch_mutex;
  std::lock_guard lock(launch_mutex);
  const void* sa = b_scale;  // cuBLAS's A is our b
  const void* sb = a_scale;
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa,
                                                 sizeof(sa)));
  MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb,
                                                 sizeof(sb)));
  const float one = 1.0f, zero = 0.0f;
  return cublasLtMatmul(cublaslt_handle(), plan.op, &one, b.data_ptr(), plan.a, a.data_ptr(),
                        plan.b, &zero, out.data_ptr(), plan.c, out.data_ptr(), plan.c, &plan.algo,
                        workspace(kWorkspaceBytes), kWorkspaceBytes, current_stream());
}

void launch_gemm(const Problem& p, const Tensor& a, const Tensor& b, const void* a_scale,
                 const void* b_scale, const Tensor& out) {
  MT_CUBLAS_CHECK(try_launch_gemm(p, a, b, a_scale, b_scale, out));
}

// Rowwise scales without cuBLASLt's epilogue: an unscaled GEMM into f32 sums, then each row's
// and column's scale by a second kernel (what every FP8 GPU can do).
void scale_after_gemm(const Problem& p, const Tensor& a, const Tensor& b, const Tensor& a_scale_inv,
                      const Tensor& b_scale_inv, const Tensor& out) {
  const TensorOptions f32 = TensorOptions{}.with_dtype(DType::F32).with_device(out.device());
  const Tensor ones = Tensor::empty({1}, f32);
  ones.fill_(1.0);
  const Tensor sums = out.dtype() == DType::F32 ? out : Tensor::empty(out.shape(), f32);
  Problem unscaled = p;
  unscaled.out = DType::F32;
  launch_gemm(unscaled, a, b, ones.data_ptr(), ones.data_ptr(), sums);
  const bool a_rows = a_scale_inv.numel() > 1, b_rows = b_scale_inv.numel() > 1;
  dispatch_f32_bf16(out.dtype(), "float8_matmul", [&](auto tag) {
    using T = decltype(tag);
    scale_rows_cols_kernel<T><<<blocks_for(out.numel()), kThreads, 0, current_stream()>>>(
        ptr<const float>(sums), p.m, p.n, ptr<const float>(a_scale_inv), a_rows,
        ptr<const float>(b_scale_inv), b_rows, ptr<T>(out));
    MT_CUDA_CHECK_LAUNCH();
  });
}

// Host codes of a [rows, cols] operand of the check GEMM below: values in {0, +-0.5, +-1, +-2}.
std::vector<uint8_t> check_operand(int64_t rows, int64_t cols, Float8Format format, int salt,
                                   std::vector<double>& values) {
  static constexpr double kValues[] = {0, 0.5, -0.5, 1, -1, 2, -2};
  std::vector<uint8_t> codes(size_t(rows * cols));
  values.resize(codes.size());
  for (size_t e = 0; e < codes.size(); ++e) {
    values[e] = kValues[(e * 2654435761u + size_t(salt)) % 7];
    codes[e] = float_to_float8(float(values[e]), format);
  }
  return codes;
}

// Runs cuBLASLt's outer-vector scale mode once on a GEMM whose every product and partial sum is
// exact in any order and accumulation precision (values from check_operand, |sums| <= 256 in
// steps of 1/4, power-of-two scales that differ by row and by column), so that its output must
// equal the host's bit for bit; says on stderr (once per key) why it is not used when it is not.
bool outer_vec_exact(Float8Format a_format, Float8Format b_format, DType out_dtype,
                     bool fast_accum) {
  const Problem p{32, 48, 64, a_format, b_format, out_dtype, fast_accum, /*outer_vec=*/true};
  auto say = [&](const char* why) {
    std::fprintf(stderr,
                 "float8_matmul: rowwise GEMMs (%s x %s -> %s%s) scale in a second kernel: %s\n",
                 float8_format_name(a_format), float8_format_name(b_format), dtype_name(out_dtype),
                 fast_accum ? ", fast accumulation" : "", why);
    return false;
  };
  if (const Plan& plan = plan_for(p); !plan.found) return say(plan.why_not_found.c_str());
  std::vector<double> a_values, b_values;
  const std::vector<uint8_t> a_codes = check_operand(p.m, p.k, a_format, 1, a_values);
  const std::vector<uint8_t> b_codes = check_operand(p.n, p.k, b_format, 4, b_values);
  std::vector<float> a_inv(size_t(p.m)), b_inv(size_t(p.n));
  for (int64_t i = 0; i < p.m; ++i) a_inv[size_t(i)] = std::ldexp(1.0f, int(i % 7) - 3);
  for (int64_t j = 0; j < p.n; ++j) b_inv[size_t(j)] = std::ldexp(1.0f, int(j % 5) - 2);
  std::vector<float> want(size_t(p.m * p.n));
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < p.k; ++k)
        sum += a_values[size_t(i * p.k + k)] * b_values[size_t(j * p.k + k)];
      want[size_t(i * p.n + j)] = float(sum * a_inv[size_t(i)] * b_inv[size_t(j)]);
    }
  }
  const Device device = Device::cuda(current_device());
  auto upload = [&](const void* data, size_t bytes, Shape shape, DType dtype) {
    Tensor t =
        Tensor::empty(std::move(shape), TensorOptions{}.with_dtype(dtype).with_device(device));
    MT_CUDA_CHECK(
        cudaMemcpyAsync(t.data_ptr(), data, bytes, cudaMemcpyHostToDevice, current_stream()));
    return t;
  };
  const Tensor a = upload(a_codes.data(), a_codes.size(), {p.m, p.k}, DType::Bool);
  const Tensor b = upload(b_codes.data(), b_codes.size(), {p.n, p.k}, DType::Bool);
  const Tensor sa = upload(a_inv.data(), a_inv.size() * 4, {p.m}, DType::F32);
  const Tensor sb = upload(b_inv.data(), b_inv.size() * 4, {p.n}, DType::F32);
  const Tensor got =
      Tensor::empty({p.m, p.n}, TensorOptions{}.with_dtype(out_dtype).with_device(device));
  const cublasStatus_t st = try_launch_gemm(p, a, b, sa.data_ptr(), sb.data_ptr(), got);
  if (st != CUBLAS_STATUS_SUCCESS) return say(cublasGetStatusString(st));
  // The host's answer in the output dtype (bf16: the runtime's round to nearest even).
  const Tensor expected = from_vector<float>(want, {p.m, p.n}).to(out_dtype);
  if (got.to(Device::cpu()).to(DType::F32).to_vector<float>() !=
      expected.to(DType::F32).to_vector<float>()) {
    return say("cuBLASLt's outer-vector scales gave a wrong answer on the check GEMM");
  }
  return true;
}

struct EpilogueKey {
  Float8Format a_format, b_format;
  DType out;
  bool fast_accum;
  auto operator<=>(const EpilogueKey&) const = default;
};

bool scales_in_epilogue(const EpilogueKey& key) {
  static std::mutex mutex;
  static std::map<EpilogueKey, bool> verdicts;
  std::lock_guard lock(mutex);  // held through the check: one check per key
  auto it = verdicts.find(key);
  if (it == verdicts.end()) {
    it = verdicts.emplace(key, outer_vec_exact(key.a_format, key.b_format, key.out, key.fast_accum))
             .first;
  }
  return it->second;
}

void cuda_float8_matmul(const Tensor& a, Float8Format a_format, const Tensor& a_scale_inv,
                        const Tensor& b, Float8Format b_format, const Tensor& b_scale_inv,
                        bool fast_accum, Tensor& out) {
  for (const Tensor* t : {&a, &b, &a_scale_inv, &b_scale_inv, static_cast<const Tensor*>(&out)}) {
    check_on_current_device(*t, "float8_matmul");
  }
  if (auto why = cuda_float8_gemm_unsupported()) MT_FAIL("float8_matmul: ", *why);
  const Problem p{a.size(0), b.size(0), a.size(1), a_format, b_format, out.dtype(), fast_accum};
  if (out.numel() == 0) return;
  if (p.k == 0) {
    out.zero_();
    return;
  }
  MT_CHECK(p.m % 16 == 0 && p.n % 16 == 0 && p.k % 16 == 0, "float8_matmul: [", p.m, ", ", p.k,
           "] @ [", p.n, ", ", p.k, "]^T: FP8 GEMMs need every dimension a multiple of 16");
  const bool a_rows = a_scale_inv.numel() > 1, b_rows = b_scale_inv.numel() > 1;
  if (!a_rows && !b_rows) {  // tensorwise: cuBLASLt applies both scales
    launch_gemm(p, a, b, a_scale_inv.data_ptr(), b_scale_inv.data_ptr(), out);
    return;
  }
  if (a_rows && b_rows && scales_in_epilogue({a_format, b_format, out.dtype(), fast_accum})) {
    Problem scaled = p;
    scaled.outer_vec = true;
    if (plan_for(scaled).found &&
        try_launch_gemm(scaled, a, b, a_scale_inv.data_ptr(), b_scale_inv.data_ptr(), out) ==
            CUBLAS_STATUS_SUCCESS) {
      return;
    }
  }
  scale_after_gemm(p, a, b, a_scale_inv, b_scale_inv, out);
}

MT_REGISTER_KERNEL(float8_gemm_unsupported_kernel, DeviceType::CUDA, cuda_float8_gemm_unsupported);
MT_REGISTER_KERNEL(float8_matmul_kernel, DeviceType::CUDA, cuda_float8_matmul);

}  // namespace

bool float8_rowwise_scales_in_epilogue(Float8Format a_format, Float8Format b_format, DType out,
                                       bool fast_accum) {
  return scales_in_epilogue({a_format, b_format, out, fast_accum});
}

}  // namespace mt::runtime::cuda
