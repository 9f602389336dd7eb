// GEMMs through oneDNN's matmul primitive (see onednn_gemm.h).
//
// A primitive is made once per problem (dtypes, sizes, strides, alpha, beta) and kept in a
// process-wide cache; each call binds the operands' pointers to it. The scratchpad is the
// caller's (a thread-local buffer), so the same primitive can run on several threads at once.
#include "runtime/cpu/onednn_gemm.h"

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

#if defined(__x86_64__) && defined(__GNUC__)
bool has_avx512_bf16() { return __builtin_cpu_supports("avx512bf16"); }
bool has_avx512f() { return __builtin_cpu_supports("avx512f"); }
#else
bool has_avx512_bf16() { return false; }
bool has_avx512f() { return false; }
#endif

// One dtype's switch: the CPU feature it needs, the environment variable with its two values,
// and the decision (-1 until first asked).
struct Switch {
  const char* feature;
  bool (*cpu_has)();
  const char* env;
  const char* on_value;
  const char* off_value;
  std::atomic<int> state{-1};

  bool enabled() {
    int v = state.load(std::memory_order_relaxed);
    if (v < 0) {
      const char* e = std::getenv(env);
      const bool off = e && std::strcmp(e, off_value) == 0;
      MT_CHECK(!e || off || std::strcmp(e, on_value) == 0, env, " must be '", on_value, "' or '",
               off_value, "', got '", e, "'");
      v = cpu_has() && !off;
      state.store(v, std::memory_order_relaxed);
    }
    return v == 1;
  }
  void set(bool on) {
    MT_CHECK(!on || cpu_has(), env, "=", on_value, " needs a CPU with ", feature,
             "; this one has none");
    state.store(on, std::memory_order_relaxed);
  }
};

Switch& bf16_switch() {
  static Switch s{"AVX512_BF16", has_avx512_bf16, "MT_CPU_BF16_GEMM", "native", "widen"};
  return s;
}
Switch& f32_switch() {
  static Switch s{"AVX512F", has_avx512f, "MT_CPU_F32_GEMM", "onednn", "openblas"};
  return s;
}

// The engine and the primitive cache are never destroyed: oneDNN's own statics may be gone by the
// time a static destructor would release them at exit.
dnnl::engine& cpu_engine() {
  static auto* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

dnnl::memory::data_type onednn_type(DType t) {
  return t == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// Everything that makes one primitive differ from another.
struct ProblemKey {
  DType in, out;
  int64_t m, n, k, a_rs, a_cs, b_rs, b_cs, ldc;
  float alpha, beta;
  auto tie() const { return std::tie(in, out, m, n, k, a_rs, a_cs, b_rs, b_cs, ldc, alpha, beta); }
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
    auto p = std::make_shared<Problem>();
    p->a = dnnl::memory::desc({key.m, key.k}, onednn_type(key.in), {key.a_rs, key.a_cs});
    p->b = dnnl::memory::desc({key.k, key.n}, onednn_type(key.in), {key.b_rs, key.b_cs});
    p->c = dnnl::memory::desc({key.m, key.n}, onednn_type(key.out), {key.ldc, 1});
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
      MT_FAIL(dtype_name(key.in), " GEMM [", key.m, " x ", key.k, "] @ [", key.k, " x ", key.n,
              "]: oneDNN could not make a matmul primitive: ", e.what());
    }
    return p;
  }

  std::mutex mutex_;
  std::map<ProblemKey, std::shared_ptr<const Problem>> problems_;
};

PrimitiveCache& primitive_cache() {
  static auto* cache = new PrimitiveCache;
  return *cache;
}

}  // namespace

bool onednn_bf16_gemm_enabled() { return bf16_switch().enabled(); }
bool onednn_f32_gemm_enabled() { return f32_switch().enabled(); }
void set_onednn_bf16_gemm_enabled(bool enabled) { bf16_switch().set(enabled); }
void set_onednn_f32_gemm_enabled(bool enabled) { f32_switch().set(enabled); }

void onednn_gemm(DType in, int64_t m, int64_t n, int64_t k, GemmOperand a, GemmOperand b, void* c,
                 DType out, int64_t ldc, float alpha, float beta) {
  MT_CHECK(in == DType::BF16 || in == DType::F32,
           "onednn_gemm: the operands must be bf16 or f32, got ", dtype_name(in));
  MT_CHECK(out == DType::BF16 || out == DType::F32,
           "onednn_gemm: the output must be bf16 or f32, got ", dtype_name(out));
  MT_CHECK(k > 0, "onednn_gemm: k must be positive (the caller fills an empty product)");
  if (m == 0 || n == 0) return;
  const std::shared_ptr<const Problem> p = primitive_cache().get(
      {in, out, m, n, k, a.row_stride, a.col_stride, b.row_stride, b.col_stride, ldc, alpha, beta});
  thread_local std::vector<unsigned char> scratch;
  if (scratch.size() < p->scratchpad.get_size()) scratch.resize(p->scratchpad.get_size());
  dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  p->primitive.execute(
      stream, {{DNNL_ARG_SRC, dnnl::memory(p->a, engine, const_cast<void*>(a.data))},
               {DNNL_ARG_WEIGHTS, dnnl::memory(p->b, engine, const_cast<void*>(b.data))},
               {DNNL_ARG_DST, dnnl::memory(p->c, engine, c)},
               {DNNL_ARG_SCRATCHPAD, dnnl::memory(p->scratchpad, engine, scratch.data())}});
  stream.wait();
}

}  // namespace mt::runtime::cpu
