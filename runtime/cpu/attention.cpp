// CPU kernels of scaled_dot_product_attention (see runtime/ops/attention.h for the contract).
//
// Work is cut into tiles of (up to 64) query rows x kKeyBlock keys of one (batch, head); the
// products inside a tile (q k^T, p v, ...) are small single-threaded GEMM calls (oneDNN's where
// the CPU has AVX-512, see onednn_gemm.h, else OpenBLAS's), the softmax
// bookkeeping is plain loops. Nothing of size [T, S] is ever allocated.
// Forward: one task per (batch, query head, query block); key blocks are visited in order with an
// online softmax (running max m, running sum l, accumulator rescaled by exp(m_old - m_new)).
// Backward: no two threads ever add into the same gradient element.
//   dk, dv (and dq): tasks over (batch, kv head), each owning that head's keys and the rows of dq
//           of its group of query heads; key blocks, query heads and query blocks are visited in
//           a fixed order, so one pass recomputes p = exp(scale * q.k - lse) once per tile;
//   dq alone (k and v need no gradient): tasks over (batch, query head, query block).
// Every task writes only its own outputs and its sums run in a fixed order, so the OpenMP
// schedule cannot change a single bit of the result.
// Operands may be views (attention_takes_views_kernel): the rows of a head are read and written
// with their stride as the BLAS calls' leading dimension, so the model's transposed [B, T, H, D]
// activations go in, and out and the gradients come out laid out that way, without copies.
// Operand types (E): f32 and f64, and bf16 on CPUs where oneDNN runs bf16 GEMMs
// (attention_takes_16bit_kernel): then the tiles' GEMMs take bf16 operands and give f32, the
// softmax, lse and every sum stay f32 (compute_t<E>), p and ds are rounded to bf16 for the GEMMs
// that consume them (as flash attention does), and the gradients are summed in task-local f32
// rows (Accumulator) rounded once into the bf16 outputs.
#include "runtime/kernels/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "runtime/cpu/loops.h"
#include "runtime/cpu/onednn_gemm.h"
#include "runtime/cpu/vec_math.h"

namespace mt::runtime::cpu {
namespace {

// Tile sizes: kKeyBlock keys by Geometry::qblock query rows, the most (up to kMaxQueryBlock) that
// keep a tile product's qblock * kKeyBlock * head_dim multiply-adds within OpenBLAS's threshold
// for threading a call (65536 * 4), so the calls run on the calling OpenMP thread: 64 rows for
// head_dim 64, 32 for 128. (Head dims over 512 exceed it even with one row: still correct and
// deterministic, as OpenBLAS splits a GEMM over rows and columns, never over k; they may just
// oversubscribe.) Larger tiles mean fewer, larger BLAS calls: 64 rows instead of 32 made the
// ~20M model's attention (head_dim 64) 12% faster forward + backward.
constexpr int64_t kKeyBlock = 64;
constexpr int64_t kMaxQueryBlock = 64;
constexpr int64_t kMaxTileMacs = 65536 * 4;

struct Geometry {
  int64_t batch, hq, hkv, group, t, s, d, dv;
  bool causal;
  int64_t qblock;  // query rows per tile (see kMaxTileMacs)
  // Keys [0, key_end(i)) are visible to query i (bottom-right causal alignment).
  int64_t key_end(int64_t i) const {
    return causal ? std::clamp<int64_t>(i + (s - t) + 1, 0, s) : s;
  }
  // The first query that sees key j.
  int64_t query_begin(int64_t j) const {
    return causal ? std::clamp<int64_t>(j - (s - t), 0, t) : 0;
  }
  // How many of the keys [j0, j0 + n) query i sees.
  int64_t visible(int64_t i, int64_t j0, int64_t n) const {
    return std::clamp<int64_t>(key_end(i) - j0, 0, n);
  }
};

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  const Shape &qs = q.shape(), &ks = k.shape();
  const int64_t d = qs[3], dv = v.shape()[3];
  const int64_t qblock = std::clamp<int64_t>(
      kMaxTileMacs / (kKeyBlock * std::max<int64_t>({d, dv, 1})), 1, kMaxQueryBlock);
  return {qs[0], qs[1], ks[1], qs[1] / ks[1], qs[2], ks[2], d, dv, causal, qblock};
}

// A [B, H, rows, cols] operand with stride 1 in its last dim: row r of head (b, h) starts at
// at(b, h, r), and a head's rows are `ld` elements apart.
template <class P>
struct Rows {
  explicit Rows(const Tensor& t)
      : data(t.data<std::remove_const_t<P>>()),
        batch_stride(t.stride(0)),
        head_stride(t.stride(1)),
        ld(t.stride(2)) {}
  P* at(int64_t b, int64_t h, int64_t r) const {
    return data + b * batch_stride + h * head_stride + r * ld;
  }
  P* data;
  int64_t batch_stride, head_stride, ld;
};

// Multiply-adds of one pass over the visible (query, key) pairs.
double pass_work(const Geometry& g) {
  return double(g.batch * g.hq) * double(g.t) * double(g.s) * double(g.d + g.dv) *
         (g.causal ? 0.5 : 1.0);
}

// Key blocks of a head.
int64_t kblocks(const Geometry& g) { return (g.s + kKeyBlock - 1) / kKeyBlock; }

// Runs fn(i) for i in [0, n) on OpenMP threads with a dynamic schedule (causal tasks differ in
// cost); serially when the whole job (about `work` multiply-adds) is too small to pay for a
// parallel region. Callers guarantee that tasks write disjoint outputs.
template <class Fn>
void parallel_tasks(int64_t n, double work, Fn&& fn) {
  const bool parallel = n > 1 && work >= 64.0 * double(kParallelGrain) && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// Row-major c[m, n] = alpha * op(a) @ op(b) + beta * c, with op(a) [m, k] and op(b) [k, n] of
// the operand type E and c of its compute type (beta is 0 or 1). f64 runs OpenBLAS; bf16 oneDNN
// (the kernels take bf16 only where it runs, see takes_16bit); f32 oneDNN on AVX-512 CPUs (see
// onednn_gemm.h), else OpenBLAS.
template <class E>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, compute_t<E> alpha, const E* a,
          int64_t lda, const E* b, int64_t ldb, compute_t<E> beta, compute_t<E>* c, int64_t ldc) {
  using C = compute_t<E>;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == C(0))
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, C(0));
    return;
  }
  const auto blas_op = [](bool t) { return t ? CblasTrans : CblasNoTrans; };
  if constexpr (std::is_same_v<E, double>) {
    cblas_dgemm(CblasRowMajor, blas_op(ta), blas_op(tb), int(m), int(n), int(k), alpha, a, int(lda),
                b, int(ldb), beta, c, int(ldc));
  } else {
    if (std::is_same_v<E, bfloat16> || onednn_f32_gemm_enabled()) {
      onednn_gemm(dtype_v<E>, m, n, k, ta ? GemmOperand{a, 1, lda} : GemmOperand{a, lda, 1},
                  tb ? GemmOperand{b, 1, ldb} : GemmOperand{b, ldb, 1}, c, DType::F32, ldc, alpha,
                  beta);
      return;
    }
    if constexpr (std::is_same_v<E, float>)
      cblas_sgemm(CblasRowMajor, blas_op(ta), blas_op(tb), int(m), int(n), int(k), alpha, a,
                  int(lda), b, int(ldb), beta, c, int(ldc));
  }
}

// A tile x [count] of the compute type as a GEMM operand of type E: x itself when the types are
// one, else x rounded into buf (bf16: the probabilities and score gradients enter the second
// GEMMs in bf16, as in flash attention).
template <class E, class C>
const E* as_operand(const C* x, int64_t count, std::vector<E>& buf) {
  if constexpr (std::is_same_v<E, C>) {
    return x;
  } else {
    static_assert(std::is_same_v<E, bfloat16> && std::is_same_v<C, float>);
    buf.resize(size_t(count));
    row_f32_to_bf16(x, count, &buf.data()->bits);
    return buf.data();
  }
}

// Where a task sums gradient rows [r0, r0 + count) of head (b, h) of `out` (each `cols` wide) in
// the compute type C: the output rows themselves when E is C, else a task-local C buffer that
// flush() rounds once into them. Starts at zero.
template <class E>
class Accumulator {
 public:
  using C = compute_t<E>;
  Accumulator(const Rows<E>& out, int64_t b, int64_t h, int64_t r0, int64_t count, int64_t cols)
      : out_(out.at(b, h, r0)), out_ld_(out.ld), count_(count), cols_(cols) {
    if constexpr (std::is_same_v<E, C>) {
      data_ = out_;
      ld_ = out_ld_;
      for (int64_t r = 0; r < count; ++r) std::fill(row(r), row(r) + cols, C(0));
    } else {
      buffer_.assign(size_t(count * cols), C(0));
      data_ = buffer_.data();
      ld_ = cols;
    }
  }
  C* row(int64_t r) const { return data_ + r * ld_; }
  int64_t ld() const { return ld_; }
  void flush() const {
    if constexpr (!std::is_same_v<E, C>)
      for (int64_t r = 0; r < count_; ++r)
        row_f32_to_bf16(row(r), cols_, &(out_ + r * out_ld_)->bits);
  }

 private:
  E* out_;
  int64_t out_ld_, count_, cols_;
  std::vector<C> buffer_;
  C* data_;
  int64_t ld_;
};

// Row helpers: f32 uses the vectorised exp of vec_math.h, f64 std::exp. Fixed order, so the
// results do not depend on the thread count.
float max_of(const float* x, int64_t n) { return row_max(x, n); }
double max_of(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}
float sum_of(const float* x, int64_t n) { return row_sum(x, n); }
double sum_of(const double* x, int64_t n) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j];
  return s;
}
// x[j] = exp(x[j] - shift).
void exp_shifted(float* x, int64_t n, float shift) { row_exp_scale(x, n, shift, 1.0f, x); }
void exp_shifted(double* x, int64_t n, double shift) {
  for (int64_t j = 0; j < n; ++j) x[j] = std::exp(x[j] - shift);
}

template <class E>
void forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                  Tensor& out, Tensor& lse) {
  using C = compute_t<E>;
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  const Geometry g = geometry(q, k, v, causal);
  const Rows<const E> qr(q), kr(k), vr(v);
  const Rows<E> outr(out);
  C* lp = lse.data<C>();
  const int64_t qblocks = (g.t + g.qblock - 1) / g.qblock;
  parallel_tasks(g.batch * g.hq * qblocks, pass_work(g), [&](int64_t task) {
    const int64_t bh = task / qblocks, qb = task % qblocks;
    const int64_t b = bh / g.hq, h = bh % g.hq, hk = h / g.group;
    const int64_t i0 = qb * g.qblock, rows = std::min(g.t, i0 + g.qblock) - i0;
    const E* Q = qr.at(b, h, i0);
    const E* K = kr.at(b, hk, 0);
    const E* V = vr.at(b, hk, 0);
    std::vector<C> m(size_t(rows), kNegInf), l(size_t(rows), C(0));
    std::vector<C> acc(size_t(rows * g.dv), C(0)), p(size_t(rows * kKeyBlock));
    std::vector<E> p_operand;
    const int64_t kmax = g.key_end(i0 + rows - 1);
    for (int64_t j0 = 0; j0 < kmax; j0 += kKeyBlock) {
      const int64_t n = std::min(kKeyBlock, kmax - j0);
      gemm<E>(false, true, rows, n, g.d, C(scale), Q, qr.ld, K + j0 * kr.ld, kr.ld, C(0), p.data(),
              n);
      for (int64_t r = 0; r < rows; ++r) {
        C* pr = p.data() + r * n;
        const int64_t vis = g.visible(i0 + r, j0, n);
        std::fill(pr + vis, pr + n, C(0));
        if (vis == 0) continue;
        const C mx = std::max(m[r], max_of(pr, vis));
        exp_shifted(pr, vis, mx);
        const C sum = sum_of(pr, vis);
        const C correction = std::exp(m[r] - mx);  // 0 on the row's first block (m = -inf)
        if (correction != C(1)) {
          C* a = acc.data() + r * g.dv;
          for (int64_t x = 0; x < g.dv; ++x) a[x] *= correction;
        }
        l[r] = l[r] * correction + sum;
        m[r] = mx;
      }
      gemm<E>(false, false, rows, g.dv, n, C(1), as_operand(p.data(), rows * n, p_operand), n,
              V + j0 * vr.ld, vr.ld, C(1), acc.data(), g.dv);
    }
    for (int64_t r = 0; r < rows; ++r) {
      E* o = outr.at(b, h, i0 + r);
      const C* a = acc.data() + r * g.dv;
      if (l[r] == C(0)) {  // no visible key
        std::fill(o, o + g.dv, E(0));
        lp[bh * g.t + i0 + r] = kNegInf;
        continue;
      }
      const C inv = C(1) / l[r];
      for (int64_t x = 0; x < g.dv; ++x) o[x] = E(a[x] * inv);
      lp[bh * g.t + i0 + r] = m[r] + std::log(l[r]);
    }
  });
}

// Turns a tile of scaled scores s [rows, n] (queries i0.., keys j0..) into probabilities
// p = exp(s - lse) (0 where masked) and, when dp is given, dp into ds = p * (dp - delta).
template <class C>
void probabilities(const Geometry& g, int64_t i0, int64_t rows, int64_t j0, int64_t n, const C* lse,
                   const C* delta, C* s, C* dp) {
  for (int64_t r = 0; r < rows; ++r) {
    C* sr = s + r * n;
    const int64_t vis = g.visible(i0 + r, j0, n);
    exp_shifted(sr, vis, lse[r]);
    std::fill(sr + vis, sr + n, C(0));
    if (dp) {
      C* dr = dp + r * n;
      for (int64_t c = 0; c < n; ++c) dr[c] = sr[c] * (dr[c] - delta[r]);
    }
  }
}

// A task's tiles: scores / probabilities s and their gradients ds in the compute type, and the
// two as GEMM operands where the operand type differs (see as_operand).
template <class E>
struct Tiles {
  explicit Tiles(int64_t size) : s(size_t(size)), ds(size_t(size)) {}
  std::vector<compute_t<E>> s, ds;
  std::vector<E> s_operand, ds_operand;
};

// With p_ij = exp(scale * q_i.k_j - lse_i), dp_ij = dout_i.v_j and delta_i = dout_i.out_i:
//   ds_ij = p_ij * (dp_ij - delta_i),  dq_i = scale * sum_j ds_ij k_j,
//   dk_j = scale * sum_i ds_ij q_i,     dv_j = sum_i p_ij dout_i.
template <class E>
void backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq,
                   Tensor& dk, Tensor& dv) {
  using C = compute_t<E>;
  const Geometry g = geometry(q, k, v, causal);
  const Rows<const E> qr(q), kr(k), vr(v), doutr(dout), outr(out);
  const C* lp = lse.data<C>();
  const int64_t query_rows = g.batch * g.hq * g.t;
  std::vector<C> delta(static_cast<size_t>(query_rows));  // indexed as lse: (b, h, row)
  parallel_for(query_rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(g.dv, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t i = begin; i < end; ++i) {
                   const int64_t bh = i / g.t, r = i % g.t;
                   const E* dor = doutr.at(bh / g.hq, bh % g.hq, r);
                   const E* o = outr.at(bh / g.hq, bh % g.hq, r);
                   C sum = 0;
                   for (int64_t x = 0; x < g.dv; ++x) sum += C(dor[x]) * C(o[x]);
                   delta[i] = sum;
                 }
               });
  const int64_t qblocks = (g.t + g.qblock - 1) / g.qblock;

  if (dq.defined() && !dk.defined()) {
    const Rows<E> dqr(dq);
    parallel_tasks(g.batch * g.hq * qblocks, pass_work(g), [&](int64_t task) {
      const int64_t bh = task / qblocks, qb = task % qblocks;
      const int64_t b = bh / g.hq, h = bh % g.hq, hk = h / g.group;
      const int64_t i0 = qb * g.qblock, rows = std::min(g.t, i0 + g.qblock) - i0;
      const int64_t row0 = bh * g.t + i0;
      const E* K = kr.at(b, hk, 0);
      const E* V = vr.at(b, hk, 0);
      Tiles<E> tiles(rows * kKeyBlock);
      const Accumulator<E> dq_rows(dqr, b, h, i0, rows, g.d);
      const int64_t kmax = g.key_end(i0 + rows - 1);
      for (int64_t j0 = 0; j0 < kmax; j0 += kKeyBlock) {
        const int64_t n = std::min(kKeyBlock, kmax - j0);
        gemm<E>(false, true, rows, n, g.d, C(scale), qr.at(b, h, i0), qr.ld, K + j0 * kr.ld, kr.ld,
                C(0), tiles.s.data(), n);
        gemm<E>(false, true, rows, n, g.dv, C(1), doutr.at(b, h, i0), doutr.ld, V + j0 * vr.ld,
                vr.ld, C(0), tiles.ds.data(), n);
        probabilities(g, i0, rows, j0, n, lp + row0, delta.data() + row0, tiles.s.data(),
                      tiles.ds.data());
        gemm<E>(false, false, rows, g.d, n, C(scale),
                as_operand(tiles.ds.data(), rows * n, tiles.ds_operand), n, K + j0 * kr.ld, kr.ld,
                C(1), dq_rows.row(0), dq_rows.ld());
      }
      dq_rows.flush();
    });
    return;
  }
  if (!dk.defined()) return;

  const Rows<E> dkr(dk), dvr(dv);
  // One key block of one (batch, kv head): its dk/dv rows, plus, when dq_rows is given, the dq
  // rows of the group's heads (dq_rows[member], each all T rows of its head).
  auto key_block = [&](int64_t bkv, int64_t kb, Tiles<E>& tiles,
                       const std::vector<Accumulator<E>>* dq_rows) {
    const int64_t b = bkv / g.hkv, hk = bkv % g.hkv;
    const int64_t j0 = kb * kKeyBlock, n = std::min(g.s, j0 + kKeyBlock) - j0;
    const E* K = kr.at(b, hk, j0);
    const E* V = vr.at(b, hk, j0);
    const Accumulator<E> dk_rows(dkr, b, hk, j0, n, g.d), dv_rows(dvr, b, hk, j0, n, g.dv);
    for (int64_t member = 0; member < g.group; ++member) {  // fixed order: deterministic
      const int64_t h = hk * g.group + member, bh = b * g.hq + h;
      for (int64_t qb = g.query_begin(j0) / g.qblock; qb < qblocks; ++qb) {
        const int64_t i0 = qb * g.qblock, rows = std::min(g.t, i0 + g.qblock) - i0;
        const int64_t row0 = bh * g.t + i0;
        const E* Q = qr.at(b, h, i0);
        const E* dO = doutr.at(b, h, i0);
        gemm<E>(false, true, rows, n, g.d, C(scale), Q, qr.ld, K, kr.ld, C(0), tiles.s.data(), n);
        gemm<E>(false, true, rows, n, g.dv, C(1), dO, doutr.ld, V, vr.ld, C(0), tiles.ds.data(), n);
        probabilities(g, i0, rows, j0, n, lp + row0, delta.data() + row0, tiles.s.data(),
                      tiles.ds.data());
        const E* p = as_operand(tiles.s.data(), rows * n, tiles.s_operand);
        const E* ds = as_operand(tiles.ds.data(), rows * n, tiles.ds_operand);
        gemm<E>(true, false, n, g.dv, rows, C(1), p, n, dO, doutr.ld, C(1), dv_rows.row(0),
                dv_rows.ld());
        gemm<E>(true, false, n, g.d, rows, C(scale), ds, n, Q, qr.ld, C(1), dk_rows.row(0),
                dk_rows.ld());
        if (dq_rows) {
          const Accumulator<E>& dq_head = (*dq_rows)[size_t(member)];
          gemm<E>(false, false, rows, g.d, n, C(scale), ds, n, K, kr.ld, C(1), dq_head.row(i0),
                  dq_head.ld());
        }
      }
    }
    dk_rows.flush();
    dv_rows.flush();
  };
  if (dq.defined()) {
    // dq rows are shared by all key blocks of a kv head: one task per (batch, kv head), key
    // blocks in order (so every dq row sums its key blocks in ascending order).
    const Rows<E> dqr(dq);
    parallel_tasks(g.batch * g.hkv, pass_work(g), [&](int64_t bkv) {
      const int64_t b = bkv / g.hkv, hk = bkv % g.hkv;
      Tiles<E> tiles(g.qblock * kKeyBlock);
      std::vector<Accumulator<E>> dq_rows;
      dq_rows.reserve(size_t(g.group));
      for (int64_t member = 0; member < g.group; ++member)
        dq_rows.emplace_back(dqr, b, hk * g.group + member, 0, g.t, g.d);
      for (int64_t kb = 0; kb < kblocks(g); ++kb) key_block(bkv, kb, tiles, &dq_rows);
      for (const Accumulator<E>& rows : dq_rows) rows.flush();
    });
  } else {
    parallel_tasks(g.batch * g.hkv * kblocks(g), pass_work(g), [&](int64_t task) {
      Tiles<E> tiles(g.qblock * kKeyBlock);
      key_block(task / kblocks(g), task % kblocks(g), tiles, nullptr);
    });
  }
}

// The kernels' operand types: f32 and f64, and bf16 where oneDNN runs bf16 GEMMs (takes_16bit).
template <class Fn>
void dispatch_operand(DType dtype, const char* op, Fn&& fn) {
  if (dtype == DType::F64) return fn(double{});
  if (dtype == DType::F32) return fn(float{});
  MT_CHECK(dtype == DType::BF16 && onednn_bf16_gemm_enabled(), op,
           ": the CPU kernel takes f32, f64, or bf16 on CPUs with AVX512_BF16, got ", dtype);
  fn(bfloat16{});
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                       Tensor& out, Tensor& lse) {
  dispatch_operand(q.dtype(), "scaled_dot_product_attention",
                   [&]<class E>(E) { forward_impl<E>(q, k, v, causal, scale, out, lse); });
}

// The kernels read and write rows through their strides (see the top of the file).
bool takes_views() { return true; }
// bf16 operands go into oneDNN's bf16 GEMMs, with the softmax in f32 (see the top of the file).
bool takes_16bit(DType dtype) { return dtype == DType::BF16 && onednn_bf16_gemm_enabled(); }

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& out, const Tensor& lse, bool causal, double scale, Tensor& dq,
                        Tensor& dk, Tensor& dv) {
  dispatch_operand(q.dtype(), "scaled_dot_product_attention_backward", [&]<class E>(E) {
    backward_impl<E>(dout, q, k, v, out, lse, causal, scale, dq, dk, dv);
  });
}

}  // namespace

MT_REGISTER_KERNEL(attention_forward_kernel, DeviceType::CPU, attention_forward);
MT_REGISTER_KERNEL(attention_backward_kernel, DeviceType::CPU, attention_backward);
MT_REGISTER_KERNEL(attention_takes_views_kernel, DeviceType::CPU, takes_views);
MT_REGISTER_KERNEL(attention_takes_16bit_kernel, DeviceType::CPU, takes_16bit);

}  // namespace mt::runtime::cpu
