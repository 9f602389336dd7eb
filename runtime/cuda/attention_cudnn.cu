// cuDNN fused flash attention for bf16/f16 (see attention_cudnn.h). Graphs are built once per
// (device, shapes, strides, causal, scale, dtype, direction) and cached; each device has one cuDNN handle,
// set to the current stream before every call; workspaces come from cuda::workspace().
// cuDNN's stats are the natural-log logsumexp of the scaled scores in f32, our lse.
// Causal masks: top-left when T == S (the same as bottom-right), bottom-right when T < S; T > S
// (rows that see no key) is left to the caller's kernel. Under deterministic_algorithms()
// (runtime/core/determinism.h) the backward asks for cuDNN's deterministic algorithm, whose
// workspace grows as B x H x T x S: where that would exceed an eighth of the GPU's memory (long
// sequences), it takes the non-deterministic one for that shape instead, saying so once.
// Otherwise it runs the non-deterministic one, with no such workspace, as PyTorch does.
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "runtime/cuda/attention_cudnn.h"
#include "runtime/core/determinism.h"
#include "runtime/cuda/context.h"

#if MT_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include <bit>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>
#endif

namespace mt::runtime::cuda {
namespace {

// Prints each distinct reason once per process.
void warn_once(const std::string& reason) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  std::lock_guard lock(mutex);
  if (seen.insert(reason).second)
    std::fprintf(stderr,
                 "minititan: scaled_dot_product_attention: %s; using the reference CUDA "
                 "kernel (f32 accumulation) instead of cuDNN\n",
                 reason.c_str());
}

}  // namespace

#if !MT_HAVE_CUDNN_FRONTEND

bool cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, bool, double, Tensor&,
                             Tensor&) {
  warn_once("this build has no cuDNN frontend (pip install nvidia-cudnn-frontend, re-run cmake)");
  return false;
}

bool cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, bool, double, Tensor&, Tensor&,
                              Tensor&) {
  warn_once("this build has no cuDNN frontend (pip install nvidia-cudnn-frontend, re-run cmake)");
  return false;
}

#else

namespace fe = cudnn_frontend;

namespace {

#define MT_CUDNN_CHECK(expr)                                                                      \
  do {                                                                                            \
    const cudnnStatus_t mt_cudnn_st_ = (expr);                                                    \
    if (mt_cudnn_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                                      \
      MT_FAIL("cuDNN error ", cudnnGetErrorString(mt_cudnn_st_), " in ", #expr, " at ", __FILE__, \
              ":", __LINE__);                                                                     \
    }                                                                                             \
  } while (0)

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Key {
  int device;
  bool backward;
  DType dtype;
  int64_t batch, hq, hkv, t, s, d, dv;
  bool causal;
  uint64_t scale_bits;
  bool deterministic;  // backward: cuDNN's deterministic algorithm
  // The operands' strides, 4 per operand in Uid order without the stats (always contiguous):
  // q, k, v, o, and for the backward dout, dq, dk, dv.
  std::vector<int64_t> strides;
  auto operator<=>(const Key&) const = default;

  std::vector<int64_t> strides_of(Uid uid) const {
    const size_t at = 4 * size_t(uid > kStats ? uid - 2 : uid - 1);
    return {strides.begin() + at, strides.begin() + at + 4};
  }
};

// A built graph, or why cuDNN cannot run the configuration (graph null).
struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
  std::string unsupported;
};

struct State {
  std::mutex mutex;  // graphs are not safe to execute concurrently; held for build and execute
  std::map<int, cudnnHandle_t> handles;
  std::map<Key, Entry> graphs;
};

// Never destroyed: graphs and handles must not be torn down after the CUDA context at exit.
State& state() {
  static State* s = new State;
  return *s;
}

cudnnHandle_t handle_for(State& s, int device) {
  cudnnHandle_t& h = s.handles[device];
  if (h == nullptr) MT_CUDNN_CHECK(cudnnCreate(&h));
  return h;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> st(dims.size(), 1);
  for (size_t i = dims.size() - 1; i > 0; --i) st[i - 1] = st[i] * dims[i];
  return st;
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name,
                                                    int64_t uid, std::vector<int64_t> dims,
                                                    std::vector<int64_t> st, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(st)
                      .set_data_type(type));
}

void mark_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid,
                 std::vector<int64_t> dims, std::vector<int64_t> st, fe::DataType_t type) {
  t->set_output(true).set_uid(uid).set_dim(std::move(dims)).set_stride(st).set_data_type(type);
}

template <class Attributes>
void set_mask(Attributes& a, const Key& key) {
  if (!key.causal) return;
  a.set_diagonal_alignment(key.t == key.s ? fe::DiagonalAlignment_t::TOP_LEFT
                                          : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
      .set_diagonal_band_right_bound(0);
}

std::shared_ptr<fe::graph::Graph> make_graph(const Key& key) {
  const fe::DataType_t io =
      key.dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
  const fe::DataType_t f32 = fe::DataType_t::FLOAT;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io).set_intermediate_data_type(f32).set_compute_data_type(f32);
  const std::vector<int64_t> qd{key.batch, key.hq, key.t, key.d},
      kd{key.batch, key.hkv, key.s, key.d}, vd{key.batch, key.hkv, key.s, key.dv},
      od{key.batch, key.hq, key.t, key.dv}, sd{key.batch, key.hq, key.t, 1};
  auto q = input(*g, "q", kQ, qd, key.strides_of(kQ), io),
       k = input(*g, "k", kK, kd, key.strides_of(kK), io),
       v = input(*g, "v", kV, vd, key.strides_of(kV), io);
  const float scale = float(std::bit_cast<double>(key.scale_bits));
  if (!key.backward) {
    auto attrs =
        fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(
            scale);
    set_mask(attrs, key);
    auto [o, stats] = g->sdpa(q, k, v, attrs);
    mark_output(o, kO, od, key.strides_of(kO), io);
    mark_output(stats, kStats, sd, contiguous_strides(sd), f32);
  } else {
    auto o = input(*g, "o", kO, od, key.strides_of(kO), io),
         dout = input(*g, "dout", kDO, od, key.strides_of(kDO), io),
         stats = input(*g, "stats", kStats, sd, contiguous_strides(sd), f32);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(scale)
                     .set_deterministic_algorithm(key.deterministic);
    set_mask(attrs, key);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
    mark_output(dq, kDQ, qd, key.strides_of(kDQ), io);
    mark_output(dk, kDK, kd, key.strides_of(kDK), io);
    mark_output(dv, kDV, vd, key.strides_of(kDV), io);
  }
  return g;
}

Entry build(const Key& key, cudnnHandle_t handle) {
  Entry e;
  if (key.causal && key.t > key.s) {
    e.unsupported = "a causal mask with more queries than keys (rows that see no key)";
    return e;
  }
  try {
    auto g = make_graph(key);
    fe::error_t status = g->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (status.is_bad()) {
      e.unsupported = "cuDNN cannot build this attention graph: " + status.get_message();
      return e;
    }
    fe::error_t ws = g->get_workspace_size(e.workspace_bytes);
    MT_CHECK(ws.is_good(), "cuDNN attention: get_workspace_size failed: ", ws.get_message());
    e.graph = std::move(g);
  } catch (const std::exception& ex) {  // the frontend throws on some backend errors
    e.unsupported = std::string("cuDNN cannot build this attention graph: ") + ex.what();
  }
  return e;
}

std::string describe(const Key& k) {
  return ::mt::detail::concat(k.backward ? "backward" : "forward", " ", dtype_name(k.dtype),
                              " B=", k.batch, " Hq=", k.hq, " Hkv=", k.hkv, " T=", k.t, " S=", k.s,
                              " D=", k.d, " Dv=", k.dv, k.causal ? " causal" : "", " strides ",
                              Shape(k.strides.begin(), k.strides.end()));
}

bool aligned(const Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

const Entry& cached(State& s, const Key& key, cudnnHandle_t handle) {
  auto it = s.graphs.find(key);
  if (it == s.graphs.end()) it = s.graphs.emplace(key, build(key, handle)).first;
  return it->second;
}

// Runs the cached graph of `key` with `pack`; false when cuDNN cannot run it.
bool run(Key key, std::unordered_map<int64_t, void*> pack) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const cudnnHandle_t handle = handle_for(s, key.device);
  MT_CUDNN_CHECK(cudnnSetStream(handle, current_stream()));
  const Entry* entry = &cached(s, key, handle);
  const int64_t budget = int64_t(device_properties(key.device).totalGlobalMem / 8);
  if (key.backward && key.deterministic && entry->graph && entry->workspace_bytes > budget) {
    static std::once_flag said;
    std::call_once(said, [&] {
      std::fprintf(stderr,
                   "minititan: scaled_dot_product_attention: cuDNN's deterministic backward "
                   "needs %lld MiB of workspace for %s, over an eighth of the GPU's memory: using "
                   "its non-deterministic backward for such shapes (gradients may differ in the "
                   "last bits between runs)\n",
                   static_cast<long long>(entry->workspace_bytes >> 20), describe(key).c_str());
    });
    key.deterministic = false;
    entry = &cached(s, key, handle);
  }
  const Entry& e = *entry;
  if (!e.graph) {
    warn_once(e.unsupported + " (" + describe(key) + ")");
    return false;
  }
  void* ws = e.workspace_bytes > 0 ? workspace(size_t(e.workspace_bytes)) : nullptr;
  fe::error_t status = e.graph->execute(handle, pack, ws);
  MT_CHECK(status.is_good(), "cuDNN attention (", describe(key),
           "): execute failed: ", status.get_message());
  return true;
}

// `operands` in Uid order without the stats: q, k, v, out (, dout, dq, dk, dv).
Key key_of(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
           bool backward, std::initializer_list<const Tensor*> operands) {
  const Shape &qs = q.shape(), &ks = k.shape();
  std::vector<int64_t> strides;
  for (const Tensor* t : operands) strides.insert(strides.end(), t->strides().begin(), t->strides().end());
  return {current_device(),
          backward,
          q.dtype(),
          qs[0],
          qs[1],
          ks[1],
          qs[2],
          ks[2],
          qs[3],
          v.shape()[3],
          causal,
          std::bit_cast<uint64_t>(scale),
          /*deterministic=*/backward && deterministic_algorithms(),
          std::move(strides)};
}

}  // namespace

bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                             double scale, Tensor& out, Tensor& lse) {
  if (!aligned(q) || !aligned(k) || !aligned(v) || !aligned(out) || !aligned(lse)) {
    warn_once("an operand is not 16-byte aligned");
    return false;
  }
  return run(key_of(q, k, v, causal, scale, false, {&q, &k, &v, &out}), {{kQ, q.data_ptr()},
                                                     {kK, k.data_ptr()},
                                                     {kV, v.data_ptr()},
                                                     {kO, out.data_ptr()},
                                                     {kStats, lse.data_ptr()}});
}

bool cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, bool causal, double scale,
                              Tensor& dq, Tensor& dk, Tensor& dv) {
  // cuDNN writes all three gradients: scratch tensors for those not wanted.
  const Tensor gq = dq.defined() ? dq : Tensor::empty(q.shape(), q.options());
  const Tensor gk = dk.defined() ? dk : Tensor::empty(k.shape(), k.options());
  const Tensor gv = dv.defined() ? dv : Tensor::empty(v.shape(), v.options());
  for (const Tensor* t : {&dout, &q, &k, &v, &out, &lse, &gq, &gk, &gv})
    if (!aligned(*t)) {
      warn_once("an operand is not 16-byte aligned");
      return false;
    }
  return run(key_of(q, k, v, causal, scale, true, {&q, &k, &v, &out, &dout, &gq, &gk, &gv}),
             {{kQ, q.data_ptr()},
                                                    {kK, k.data_ptr()},
                                                    {kV, v.data_ptr()},
                                                    {kO, out.data_ptr()},
                                                    {kDO, dout.data_ptr()},
                                                    {kStats, lse.data_ptr()},
                                                    {kDQ, gq.data_ptr()},
                                                    {kDK, gk.data_ptr()},
                                                    {kDV, gv.data_ptr()}});
}

#endif  // MT_HAVE_CUDNN_FRONTEND

}  // namespace mt::runtime::cuda
