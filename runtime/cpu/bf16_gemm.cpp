// Native bf16 GEMMs through oneDNN's matmul primitive (see bf16_gemm.h).
//
// A primitive is made once per problem (sizes, strides, output dtype, alpha, beta) and kept in a
// process-wide cache; each call binds the operands' pointers to it. The scratchpad is the
// caller's (a thread-local buffer), so the same primitive can run on several threads at once.
#include "runtime/cpu/bf16_gemm.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "runtime/core/error.h"

namespace mt::runtime::cpu {
namespace {

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

std::atomic<int>& native_flag() {  // -1: not decided yet
  static std::atomic<int> flag{-1};
  return flag;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Everything that makes one primitive differ from another.
struct ProblemKey {
  int64_t m, n, k, a_rs, a_cs, b_rs, b_cs, ldc;
  DType c_dtype;
  float alpha, beta;
  auto tie() const { return std::tie(m, n, k, a_rs, a_cs, b_rs, b_cs, ldc, c_dtype, alpha, beta); }
  bool operator<(const ProblemKey& o) const { return tie() < o.tie(); }
};

struct Problem {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, c, scratchpad;
};

// The primitives made so far. A training step has a few dozen distinct GEMMs; the bound only
// keeps a program with endlessly new shapes from growing without limit.
class PrimitiveCache {
 public:
  std::shared_ptr<const Problem> get(const ProblemKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = problems_.find(key);
    if (it != problems_.end()) return it->second;
    if (problems_.size() >= kMaxProblems) problems_.clear();
    auto problem = make(key);
    problems_.emplace(key, problem);
    return problem;
  }

 private:
  static constexpr size_t kMaxProblems = 4096;

  static std::shared_ptr<const Problem> make(const ProblemKey& key) {
    using dt = dnnl::memory::data_type;
    auto p = std::make_shared<Problem>();
    p->a = dnnl::memory::desc({key.m, key.k}, dt::bf16, {key.a_rs, key.a_cs});
    p->b = dnnl::memory::desc({key.k, key.n}, dt::bf16, {key.b_rs, key.b_cs});
    p->c = dnnl::memory::desc({key.m, key.n}, key.c_dtype == DType::BF16 ? dt::bf16 : dt::f32,
                              {key.ldc, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(key.beta);
      attr.set_post_ops(ops);
    }
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->a, p->b, p->c), attr, cpu_engine());
      p->scratchpad = pd.scratchpad_desc();
      p->primitive = dnnl::matmul(pd);
    } catch (const dnnl::error& e) {
      MT_FAIL("bf16 GEMM [", key.m, " x ", key.k, "] @ [", key.k, " x ", key.n,
              "]: oneDNN could not make a matmul primitive: ", e.what());
    }
    return p;
  }

  std::mutex mutex_;
  std::map<ProblemKey, std::shared_ptr<const Problem>> problems_;
};

PrimitiveCache& primitive_cache() {
  static PrimitiveCache cache;
  return cache;
}

}  // namespace

bool native_bf16_gemm_enabled() {
  int v = native_flag().load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("MT_CPU_BF16_GEMM");
    const bool widen = env && std::strcmp(env, "widen") == 0;
    MT_CHECK(!env || widen || std::strcmp(env, "native") == 0,
             "MT_CPU_BF16_GEMM must be 'native' or 'widen', got '", env, "'");
    v = cpu_has_avx512_bf16() && !widen;
    native_flag().store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_native_bf16_gemm_enabled(bool enabled) {
  MT_CHECK(!enabled || cpu_has_avx512_bf16(),
           "native bf16 GEMMs need a CPU with AVX512_BF16; this one has none");
  native_flag().store(enabled, std::memory_order_relaxed);
}

void bf16_gemm(int64_t m, int64_t n, int64_t k, Bf16Matrix a, Bf16Matrix b, void* c,
               DType c_dtype, int64_t ldc, float alpha, float beta) {
  MT_CHECK(c_dtype == DType::BF16 || c_dtype == DType::F32,
           "bf16_gemm: the output must be bf16 or f32, got ", dtype_name(c_dtype));
  MT_CHECK(k > 0, "bf16_gemm: k must be positive (the caller fills an empty product)");
  if (m == 0 || n == 0) return;
  const std::shared_ptr<const Problem> p = primitive_cache().get(
      {m, n, k, a.row_stride, a.col_stride, b.row_stride, b.col_stride, ldc, c_dtype, alpha, beta});
  thread_local std::vector<unsigned char> scratch;
  if (scratch.size() < p->scratchpad.get_size()) scratch.resize(p->scratchpad.get_size());
  dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  p->primitive.execute(
      stream, {{DNNL_ARG_SRC, dnnl::memory(p->a, engine, const_cast<bfloat16*>(a.data))},
               {DNNL_ARG_WEIGHTS, dnnl::memory(p->b, engine, const_cast<bfloat16*>(b.data))},
               {DNNL_ARG_DST, dnnl::memory(p->c, engine, c)},
               {DNNL_ARG_SCRATCHPAD, dnnl::memory(p->scratchpad, engine, scratch.data())}});
  stream.wait();
}

}  // namespace mt::runtime::cpu
