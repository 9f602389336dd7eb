// Elementwise ops: values against naive references (broadcasting, 0-D, strided inputs, bf16,
// integers, bool), gradients against finite differences, in-place ops and errors.
#include "runtime/ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "runtime/autograd/gradcheck.h"
#include "runtime/core/grad_mode.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/reduce.h"
#include "tests/testing/tensor_testing.h"

namespace mt::runtime {
namespace {

using testing::all_close;
using testing::leaf;
using testing::randn64;
using testing::randn_as;

const TensorOptions kF64 = TensorOptions{}.with_dtype(DType::F64);

// numpy broadcasting, written independently of the runtime.
Shape naive_broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i + a.size() < n ? 1 : a[i + a.size() - n];
    const int64_t db = i + b.size() < n ? 1 : b[i + b.size() - n];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Row-major flat index into `in` of the element that broadcasts to flat index `flat` of `out`.
int64_t source_index(int64_t flat, const Shape& out, const Shape& in) {
  int64_t idx = 0, stride = 1;
  for (int64_t d = int64_t(out.size()) - 1, di = int64_t(in.size()) - 1; d >= 0; --d, --di) {
    const int64_t i = flat % out[d];
    flat /= out[d];
    if (di >= 0) {
      if (in[di] != 1) idx += i * stride;
      stride *= in[di];
    }
  }
  return idx;
}

Tensor naive_binary(const Tensor& a, const Tensor& b,
                    const std::function<double(double, double)>& f, DType dtype = DType::F64) {
  const Shape shape = naive_broadcast(a.shape(), b.shape());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = f(va[source_index(i, shape, a.shape())], vb[source_index(i, shape, b.shape())]);
  return from_vector<double>(out, shape, TensorOptions{}.with_dtype(dtype));
}

std::string str(const Shape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

Tensor naive_unary(const Tensor& x, const std::function<double(double)>& f) {
  auto v = x.to_vector<double>();
  for (double& e : v) e = f(e);
  return from_vector<double>(v, x.shape(), kF64);
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
};

std::vector<BinaryCase> arithmetic_cases() {
  return {
      {"add", [](auto& a, auto& b) { return add(a, b); }, [](double x, double y) { return x + y; }},
      {"sub", [](auto& a, auto& b) { return sub(a, b); }, [](double x, double y) { return x - y; }},
      {"mul", [](auto& a, auto& b) { return mul(a, b); }, [](double x, double y) { return x * y; }},
      {"div", [](auto& a, auto& b) { return div(a, b); }, [](double x, double y) { return x / y; }},
      {"maximum", [](auto& a, auto& b) { return maximum(a, b); },
       [](double x, double y) { return std::max(x, y); }},
      {"minimum", [](auto& a, auto& b) { return minimum(a, b); },
       [](double x, double y) { return std::min(x, y); }},
      {"pow", [](auto& a, auto& b) { return pow(abs(a), b); },
       [](double x, double y) { return std::pow(std::abs(x), y); }},
  };
}

TEST(Elementwise, BinaryBroadcastingMatchesNaive) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 1, 4}, {2, 1}}, {{2, 3}, {2, 3}}, {{5}, {4, 1}},    {{}, {2, 3}},
      {{2, 3}, {}},        {{}, {}},         {{1}, {3, 1, 1}}, {{0, 3}, {3}}};
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const auto& [sa, sb] : shapes) {
      const Tensor a = randn_as(sa, dtype, 1), b = randn_as(sb, dtype, 2);
      for (const auto& c : arithmetic_cases()) {
        const Tensor y = c.op(a, b);
        EXPECT_EQ(y.dtype(), dtype);
        EXPECT_TRUE(all_close(y, naive_binary(a, b, c.ref), 1e-6, 1e-5))
            << c.name << " " << str(sa) << " " << str(sb) << " " << dtype;
      }
    }
  }
}

TEST(Elementwise, NonContiguousInputs) {
  const Tensor a = randn_as({4, 5}, DType::F32, 3).t();                    // [5, 4] transposed
  const Tensor b = randn_as({5, 8}, DType::F32, 4).slice(1, 0, 8, 2);      // [5, 4] step 2
  const Tensor c = randn_as({4}, DType::F32, 5);                           // broadcast row
  const Tensor d = randn_as({3, 5, 1}, DType::F32, 6).permute({1, 0, 2});  // [5, 3, 1]
  for (const auto& bc : arithmetic_cases()) {
    EXPECT_TRUE(all_close(bc.op(a, b), naive_binary(a, b, bc.ref), 1e-6, 1e-5)) << bc.name;
    EXPECT_TRUE(all_close(bc.op(a, c), naive_binary(a, c, bc.ref), 1e-6, 1e-5)) << bc.name;
    EXPECT_TRUE(all_close(bc.op(c, a), naive_binary(c, a, bc.ref), 1e-6, 1e-5)) << bc.name;
    const Tensor a3 = a.unsqueeze(1);  // [5, 1, 4] with d [5, 3, 1] -> [5, 3, 4]
    EXPECT_TRUE(all_close(bc.op(a3, d), naive_binary(a3, d, bc.ref), 1e-6, 1e-5)) << bc.name;
  }
  EXPECT_TRUE(all_close(exp(a), naive_unary(a, [](double v) { return std::exp(v); }), 1e-6, 1e-5));
}

TEST(Elementwise, LargeContiguousAndBroadcastRuns) {
  // Big enough to take the parallel paths; the bias-like [N, C] + [C] and scalar-tensor cases.
  const Tensor a = randn_as({300, 257}, DType::F32, 7), b = randn_as({257}, DType::F32, 8);
  const Tensor s = randn_as({}, DType::F32, 9);
  EXPECT_TRUE(all_close(add(a, b), naive_binary(a, b, std::plus<double>()), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(mul(s, a), naive_binary(s, a, std::multiplies<double>()), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(sub(a, s), naive_binary(a, s, std::minus<double>()), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(mul(a, a), naive_binary(a, a, std::multiplies<double>()), 1e-6, 1e-6));
}

TEST(Elementwise, UnaryMatchesNaive) {
  const Tensor x = randn_as({3, 7}, DType::F64, 10);
  const Tensor pos = add(abs(x), 0.1);
  struct Case {
    UnaryOp op;
    bool positive;
    std::function<double(double)> ref;
  };
  const std::vector<Case> cases = {
      {UnaryOp::Neg, false, [](double v) { return -v; }},
      {UnaryOp::Exp, false, [](double v) { return std::exp(v); }},
      {UnaryOp::Log, true, [](double v) { return std::log(v); }},
      {UnaryOp::Sqrt, true, [](double v) { return std::sqrt(v); }},
      {UnaryOp::Rsqrt, true, [](double v) { return 1 / std::sqrt(v); }},
      {UnaryOp::Abs, false, [](double v) { return std::abs(v); }},
      {UnaryOp::Sin, false, [](double v) { return std::sin(v); }},
      {UnaryOp::Cos, false, [](double v) { return std::cos(v); }},
      {UnaryOp::Tanh, false, [](double v) { return std::tanh(v); }},
      {UnaryOp::Sigmoid, false, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {UnaryOp::Relu, false, [](double v) { return v > 0 ? v : 0; }},
      {UnaryOp::Silu, false, [](double v) { return v / (1 + std::exp(-v)); }},
      {UnaryOp::Square, false, [](double v) { return v * v; }},
      {UnaryOp::Reciprocal, true, [](double v) { return 1 / v; }},
  };
  for (const Case& c : cases) {
    const Tensor in = c.positive ? pos : x;
    EXPECT_TRUE(all_close(unary(c.op, in), naive_unary(in, c.ref), 1e-12, 1e-12)) << int(c.op);
    // f32 through the same op.
    const Tensor in32 = in.to(DType::F32);
    EXPECT_TRUE(all_close(unary(c.op, in32), naive_unary(in32, c.ref), 1e-6, 1e-5)) << int(c.op);
  }
  EXPECT_TRUE(
      all_close(pow(pos, 3.0), naive_unary(pos, [](double v) { return v * v * v; }), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(pow(x, 2.0), naive_unary(x, [](double v) { return v * v; }), 0, 0));
  EXPECT_TRUE(all_close(pow(pos, -0.5), naive_unary(pos, [](double v) { return 1 / std::sqrt(v); }),
                        1e-12, 1e-12));
}

TEST(Elementwise, ScalarOverloads) {
  const Tensor x = randn_as({2, 3}, DType::F32, 11);
  auto ref = [&](std::function<double(double)> f) { return naive_unary(x, f); };
  EXPECT_TRUE(all_close(add(x, 2.5), ref([](double v) { return v + 2.5; }), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(sub(x, 2.5), ref([](double v) { return v - 2.5; }), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(x * 3.0, ref([](double v) { return v * 3; }), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(3.0 * x, ref([](double v) { return v * 3; }), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(x / 4.0, ref([](double v) { return v / 4; }), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(-x, ref([](double v) { return -v; }), 0, 0));
  EXPECT_EQ(add(x, 1.0).dtype(), DType::F32);
}

TEST(Elementwise, Bf16ComputesInF32AndRounds) {
  const Tensor a = randn_as({4, 33}, DType::BF16, 12), b = randn_as({33}, DType::BF16, 13);
  for (const auto& c : arithmetic_cases()) {
    const Tensor y = c.op(a, b);
    EXPECT_EQ(y.dtype(), DType::BF16);
    // bf16 has 8 significant bits: one rounding of the exact result.
    EXPECT_TRUE(all_close(y, naive_binary(a, b, c.ref), 1e-6, 1.0 / 128)) << c.name;
  }
  EXPECT_TRUE(
      all_close(exp(a), naive_unary(a, [](double v) { return std::exp(v); }), 1e-6, 1.0 / 128));
  const Tensor h = randn_as({50}, DType::F16, 14);
  EXPECT_TRUE(all_close(silu(h), naive_unary(h, [](double v) { return v / (1 + std::exp(-v)); }),
                        1e-3, 1.0 / 512));
  // An exact case: 1 + 2^-8 is not a bf16; it rounds to even (1.0).
  const Tensor one = full({1}, 1.0, TensorOptions{}.with_dtype(DType::BF16));
  EXPECT_EQ(add(one, std::ldexp(1.0, -8)).item<double>(), 1.0);
  EXPECT_EQ(add(one, 3 * std::ldexp(1.0, -8)).item<double>(), 1.0 + std::ldexp(1.0, -6));
}

// Dense bf16 add/sub/mul/div (same shapes, contiguous: the vectorised path, 5000 elements over
// several chunks and threads, specials included) and in-place add_: bitwise one f32 op on the
// widened values, rounded once to bf16.
TEST(Elementwise, DenseBf16ArithmeticIsOneRoundedF32Op) {
  std::vector<double> a64 = randn_as({5000}, DType::BF16, 15).to_vector<double>();
  std::vector<double> b64 = randn_as({5000}, DType::BF16, 16).to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> specials = {0.0, -0.0, inf, -inf, std::nan(""), 1e38, 3e-39};
  for (size_t i = 0; i < specials.size(); ++i) {
    a64[i] = specials[i];
    b64[specials.size() - 1 - i] = specials[i];
  }
  const TensorOptions bf16 = TensorOptions{}.with_dtype(DType::BF16);
  const Tensor a = from_vector<double>(a64, {5000}, bf16),
               b = from_vector<double>(b64, {5000}, bf16);
  const std::vector<float> av = a.to_vector<float>(), bv = b.to_vector<float>();
  const auto bits_of = [](const Tensor& t) {
    std::vector<uint16_t> out;
    for (int64_t i = 0; i < t.numel(); ++i) out.push_back(t.data<bfloat16>()[i].bits);
    return out;
  };
  const auto expected = [&](float (*f)(float, float)) {
    std::vector<uint16_t> out;
    for (size_t i = 0; i < av.size(); ++i) out.push_back(bfloat16(f(av[i], bv[i])).bits);
    return out;
  };
  EXPECT_EQ(bits_of(add(a, b)), expected([](float x, float y) { return x + y; }));
  EXPECT_EQ(bits_of(sub(a, b)), expected([](float x, float y) { return x - y; }));
  EXPECT_EQ(bits_of(mul(a, b)), expected([](float x, float y) { return x * y; }));
  EXPECT_EQ(bits_of(div(a, b)), expected([](float x, float y) { return x / y; }));
  const Tensor c = a.clone();
  add_(c, b);
  EXPECT_EQ(bits_of(c), expected([](float x, float y) { return x + y; }));
}

TEST(Elementwise, IntegerOps) {
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64);
  const Tensor a = from_vector<int64_t>({7, -7, 9, 0, 5, -3}, {2, 3}, i64);
  const Tensor b = from_vector<int64_t>({2, 2, -4}, {3}, i64);
  EXPECT_EQ(add(a, b).to_vector<int64_t>(), (std::vector<int64_t>{9, -5, 5, 2, 7, -7}));
  EXPECT_EQ(sub(a, b).to_vector<int64_t>(), (std::vector<int64_t>{5, -9, 13, -2, 3, 1}));
  EXPECT_EQ(mul(a, b).to_vector<int64_t>(), (std::vector<int64_t>{14, -14, -36, 0, 10, 12}));
  EXPECT_EQ(div(a, b).to_vector<int64_t>(), (std::vector<int64_t>{3, -3, -2, 0, 2, 0}));  // trunc
  EXPECT_EQ(maximum(a, b).to_vector<int64_t>(), (std::vector<int64_t>{7, 2, 9, 2, 5, -3}));
  EXPECT_EQ(minimum(a, b).to_vector<int64_t>(), (std::vector<int64_t>{2, -7, -4, 0, 2, -4}));
  EXPECT_EQ(lt(a, b).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 1, 0, 0}));
  EXPECT_EQ(ge(a, b).dtype(), DType::Bool);
  EXPECT_EQ(add(a, 3.0).to_vector<int64_t>(), (std::vector<int64_t>{10, -4, 12, 3, 8, 0}));
  EXPECT_EQ(div(a, 2.0).to_vector<int64_t>(), (std::vector<int64_t>{3, -3, 4, 0, 2, -1}));
  EXPECT_EQ(neg(a).to_vector<int64_t>(), (std::vector<int64_t>{-7, 7, -9, 0, -5, 3}));
  EXPECT_EQ(abs(a).to_vector<int64_t>(), (std::vector<int64_t>{7, 7, 9, 0, 5, 3}));
  EXPECT_EQ(relu(a).to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9, 0, 5, 0}));
  EXPECT_EQ(clamp(a, -5.0, 6.5).to_vector<int64_t>(), (std::vector<int64_t>{6, -5, 6, 0, 5, -3}));
  // Comparing integers to a non-integer scalar is exact.
  EXPECT_EQ(lt(a, 2.5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(eq(a, 0.5).to_vector<int64_t>(), (std::vector<int64_t>(6, 0)));
  // i32 too, with wrapping instead of undefined overflow.
  const TensorOptions i32 = TensorOptions{}.with_dtype(DType::I32);
  const Tensor big = from_vector<int64_t>({std::numeric_limits<int32_t>::max(), -6}, {2}, i32);
  const Tensor two = from_vector<int64_t>({1, 4}, {2}, i32);
  EXPECT_EQ(add(big, two).to_vector<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int32_t>::min(), -2}));
  EXPECT_EQ(add(big, two).dtype(), DType::I32);
  const Tensor lowest = from_vector<int64_t>({std::numeric_limits<int64_t>::min()}, {1}, i64);
  EXPECT_EQ(div(lowest, -1.0).item<int64_t>(), std::numeric_limits<int64_t>::min());
  // Errors: division by zero, non-integer scalars, float-only ops.
  EXPECT_THROW(div(a, zeros({3}, i64)), mt::Error);
  EXPECT_THROW(div(a, 0.0), mt::Error);
  EXPECT_THROW(mul(a, 0.5), mt::Error);
  EXPECT_THROW(exp(a), mt::Error);
  EXPECT_THROW(pow(a, b), mt::Error);
}

TEST(Elementwise, BoolAndLogicalOps) {
  const TensorOptions bopt = TensorOptions{}.with_dtype(DType::Bool);
  const Tensor p = from_vector<int64_t>({1, 1, 0, 0}, {4}, bopt);
  const Tensor q = from_vector<int64_t>({1, 0, 1, 0}, {4}, bopt);
  EXPECT_EQ(logical_and(p, q).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 0}));
  EXPECT_EQ(logical_or(p, q).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(logical_not(p).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(eq(p, q).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 1}));
  EXPECT_EQ(ne(p, q).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 0}));
  EXPECT_EQ(logical_and(p, q).dtype(), DType::Bool);
  // Logical ops on numbers use truthiness.
  const Tensor x = from_vector<double>({0.0, 2.0, -1.0}, {3}, kF64);
  EXPECT_EQ(logical_not(x).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_THROW(add(p, q), mt::Error);
  EXPECT_THROW(neg(p), mt::Error);
}

TEST(Elementwise, ComparisonsAgainstNaive) {
  const Tensor a = randn_as({3, 4}, DType::F32, 15);
  const Tensor b = a.slice(0, 1, 2);  // [1, 4]: equal elements in row 1
  const std::vector<std::pair<std::function<Tensor(const Tensor&, const Tensor&)>,
                              std::function<double(double, double)>>>
      cmps = {
          {[](auto& x, auto& y) { return eq(x, y); }, [](double x, double y) { return x == y; }},
          {[](auto& x, auto& y) { return ne(x, y); }, [](double x, double y) { return x != y; }},
          {[](auto& x, auto& y) { return lt(x, y); }, [](double x, double y) { return x < y; }},
          {[](auto& x, auto& y) { return le(x, y); }, [](double x, double y) { return x <= y; }},
          {[](auto& x, auto& y) { return gt(x, y); }, [](double x, double y) { return x > y; }},
          {[](auto& x, auto& y) { return ge(x, y); }, [](double x, double y) { return x >= y; }}};
  for (const auto& [op, ref] : cmps) {
    const Tensor y = op(a, b);
    EXPECT_EQ(y.dtype(), DType::Bool);
    EXPECT_TRUE(all_close(y, naive_binary(a, b, ref), 0, 0));
  }
  EXPECT_TRUE(all_close(gt(a, 0.25), naive_unary(a, [](double v) { return v > 0.25f; }), 0, 0));
  EXPECT_TRUE(all_close(le(a, 0.0), naive_unary(a, [](double v) { return v <= 0; }), 0, 0));
}

TEST(Elementwise, WhereAndClampValues) {
  const Tensor c = gt(randn_as({3, 1}, DType::F32, 16), 0.0);
  const Tensor a = randn_as({3, 4}, DType::F32, 17), b = randn_as({4}, DType::F32, 18);
  const Tensor y = where(c, a, b);
  ASSERT_EQ(y.shape(), (Shape{3, 4}));
  const auto vc = c.to_vector<int64_t>();
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>(), vy = y.to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(vy[i * 4 + j], vc[i] ? va[i * 4 + j] : vb[j]);
  EXPECT_THROW(where(a, a, b), mt::Error);  // non-bool condition

  const Tensor x = from_vector<double>({-2.0, -0.5, 0.5, 3.0, NAN}, {5}, kF64);
  const auto cl = clamp(x, -1.0, 1.0).to_vector<double>();
  EXPECT_EQ(cl[0], -1.0);
  EXPECT_EQ(cl[1], -0.5);
  EXPECT_EQ(cl[3], 1.0);
  EXPECT_TRUE(std::isnan(cl[4]));
  EXPECT_EQ(clamp(x, std::nullopt, 0.0).to_vector<double>()[3], 0.0);
  EXPECT_EQ(clamp(x, 0.0, std::nullopt).to_vector<double>()[0], 0.0);
  EXPECT_THROW(clamp(x, std::nullopt, std::nullopt), mt::Error);
  // maximum/minimum propagate NaN.
  const Tensor nan = full({5}, NAN, kF64);
  EXPECT_TRUE(std::isnan(maximum(x, nan).to_vector<double>()[0]));
  EXPECT_TRUE(std::isnan(minimum(nan, x).to_vector<double>()[0]));
}

TEST(Elementwise, DtypeMismatchErrorNamesOpShapesAndDtypes) {
  const Tensor a = randn_as({2, 3}, DType::F32, 19), b = randn_as({3}, DType::F64, 20);
  try {
    add(a, b);
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  }
  try {
    mul(a, randn_as({4}, DType::F32, 21));
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("mul"), std::string::npos) << e.what();
  }
  EXPECT_THROW(where(gt(a, 0.0), a, b), mt::Error);
}

// ---- gradients ---------------------------------------------------------------------------------

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

void expect_gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, const std::string& what) {
  const auto r = autograd::gradcheck(fn, inputs);
  EXPECT_TRUE(r.ok) << what << "\n" << r.message;
}

TEST(ElementwiseGrad, UnaryOps) {
  const Tensor x = randn64({3, 4}, 30);
  const Tensor pos = leaf(add(abs(randn64({3, 4}, 31, false)), 0.2));
  const Tensor xt = leaf(randn64({4, 3}, 32, false).t());  // non-contiguous leaf
  for (UnaryOp op :
       {UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Abs, UnaryOp::Sin, UnaryOp::Cos, UnaryOp::Tanh,
        UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::Silu, UnaryOp::Square}) {
    expect_gradcheck([op](const auto& in) { return unary(op, in[0]); }, {x},
                     "op " + std::to_string(int(op)));
    expect_gradcheck([op](const auto& in) { return unary(op, in[0]); }, {xt},
                     "strided op " + std::to_string(int(op)));
  }
  for (UnaryOp op : {UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Reciprocal})
    expect_gradcheck([op](const auto& in) { return unary(op, in[0]); }, {pos},
                     "op " + std::to_string(int(op)));
  expect_gradcheck([](const auto& in) { return pow(in[0], 3.0); }, {x}, "pow 3");
  expect_gradcheck([](const auto& in) { return pow(in[0], 2.0); }, {x}, "pow 2");
  expect_gradcheck([](const auto& in) { return pow(in[0], 1.0); }, {x}, "pow 1");
  expect_gradcheck([](const auto& in) { return pow(in[0], 0.0); }, {x}, "pow 0");
  expect_gradcheck([](const auto& in) { return pow(in[0], -1.5); }, {pos}, "pow -1.5");
}

TEST(ElementwiseGrad, BinaryOpsWithBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 1, 4}, {2, 1}}, {{2, 3}, {2, 3}}, {{}, {2, 3}}, {{4, 1}, {5}}};
  for (const auto& [sa, sb] : shapes) {
    const Tensor a = randn64(sa, 40), b = randn64(sb, 41);
    const Tensor bpos = leaf(add(abs(randn64(sb, 42, false)), 0.5));
    const Tensor apos = leaf(add(abs(randn64(sa, 43, false)), 0.5));
    SCOPED_TRACE(str(sa) + " and " + str(sb));
    expect_gradcheck([](const auto& in) { return add(in[0], in[1]); }, {a, b}, "add");
    expect_gradcheck([](const auto& in) { return sub(in[0], in[1]); }, {a, b}, "sub");
    expect_gradcheck([](const auto& in) { return mul(in[0], in[1]); }, {a, b}, "mul");
    expect_gradcheck([](const auto& in) { return div(in[0], in[1]); }, {a, bpos}, "div");
    expect_gradcheck([](const auto& in) { return maximum(in[0], in[1]); }, {a, b}, "max");
    expect_gradcheck([](const auto& in) { return minimum(in[0], in[1]); }, {a, b}, "min");
    expect_gradcheck([](const auto& in) { return pow(in[0], in[1]); }, {apos, b}, "pow");
  }
  // Only one operand requiring grad; the other a plain tensor.
  const Tensor a = randn64({2, 3}, 44), c = randn64({3}, 45, false);
  expect_gradcheck([c](const auto& in) { return mul(in[0], c); }, {a}, "mul const");
  expect_gradcheck([c](const auto& in) { return div(c, add(abs(in[0]), 1.0)); }, {a}, "div const");
}

// pow(a, b) at b == 0: a^0 is 1 whatever a is, so d/da is 0, also at a == 0 (the formula
// b a^(b-1) gives 0 * inf there); d/db is log(a) a^b, 0 at a == 0 (the limit), as PyTorch.
TEST(ElementwiseGrad, PowAtAZeroExponentHasZeroBaseGradient) {
  const TensorOptions f64 = TensorOptions{}.with_dtype(DType::F64);
  const Tensor a = leaf(from_vector<double>({0.0, 0.0, 2.0, 0.0}, {4}, f64));
  const Tensor b = leaf(from_vector<double>({0.0, 2.0, 0.0, 1.0}, {4}, f64));
  sum(pow(a, b)).backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0, 0.0, 1.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0, std::log(2.0), 0.0}));
}

TEST(ElementwiseGrad, NonContiguousBinary) {
  const Tensor a = leaf(randn64({4, 3}, 50, false).t());                // [3, 4]
  const Tensor b = leaf(randn64({3, 8}, 51, false).slice(1, 1, 8, 2));  // [3, 4]
  const Tensor c = leaf(randn64({4, 2}, 52, false).slice(1, 0, 1));     // [4, 1]
  expect_gradcheck([](const auto& in) { return mul(in[0], in[1]); }, {a, b}, "mul strided");
  expect_gradcheck([](const auto& in) { return sub(in[0], in[1].t()); }, {a, c}, "sub strided");
  expect_gradcheck([](const auto& in) { return maximum(in[0], in[1]); }, {a, b}, "max strided");
}

TEST(ElementwiseGrad, ScalarOpsWhereClamp) {
  const Tensor x = randn64({2, 5}, 60);
  expect_gradcheck([](const auto& in) { return add(in[0], 1.5); }, {x}, "add scalar");
  expect_gradcheck([](const auto& in) { return sub(in[0], 1.5); }, {x}, "sub scalar");
  expect_gradcheck([](const auto& in) { return mul(in[0], -2.5); }, {x}, "mul scalar");
  expect_gradcheck([](const auto& in) { return div(in[0], 4.0); }, {x}, "div scalar");
  const Tensor cond = gt(randn64({2, 1}, 61, false), 0.0);
  const Tensor b = randn64({5}, 62);
  expect_gradcheck([cond](const auto& in) { return where(cond, in[0], in[1]); }, {x, b}, "where");
  expect_gradcheck([](const auto& in) { return clamp(in[0], -0.5, 0.7); }, {x}, "clamp");
  expect_gradcheck([](const auto& in) { return clamp(in[0], std::nullopt, 0.1); }, {x},
                   "clamp max");
  expect_gradcheck([](const auto& in) { return clamp(in[0], 0.1, std::nullopt); }, {x},
                   "clamp min");
}

TEST(ElementwiseGrad, TiesSplitMaximumMinimumGradient) {
  const Tensor a = leaf(from_vector<double>({1.0, 2.0, 3.0}, {3}, kF64));
  const Tensor b = leaf(from_vector<double>({1.0, 5.0, 0.0}, {3}, kF64));
  maximum(a, b).backward(ones({3}, kF64));
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{0.5, 0.0, 1.0}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{0.5, 1.0, 0.0}));
  const Tensor c = leaf(from_vector<double>({1.0, 2.0, 3.0}, {3}, kF64));
  const Tensor d = leaf(from_vector<double>({1.0, 5.0, 0.0}, {3}, kF64));
  minimum(c, d).backward(ones({3}, kF64));
  EXPECT_EQ(c.grad().to_vector<double>(), (std::vector<double>{0.5, 1.0, 0.0}));
  EXPECT_EQ(d.grad().to_vector<double>(), (std::vector<double>{0.5, 0.0, 1.0}));
  // relu at exactly 0 and pow(0, b) have the conventional gradient 0.
  const Tensor z = leaf(zeros({2}, kF64));
  relu(z).backward(ones({2}, kF64));
  EXPECT_EQ(z.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  const Tensor base = zeros({1}, kF64);
  const Tensor e = leaf(full({1}, 2.0, kF64));
  pow(base, e).backward(ones({1}, kF64));
  EXPECT_EQ(e.grad().item<double>(), 0.0);
}

TEST(ElementwiseGrad, Bf16BackwardRuns) {
  Tensor x = randn_as({8}, DType::BF16, 63);
  x.set_requires_grad(true);
  mul(x, x).backward(ones({8}, TensorOptions{}.with_dtype(DType::BF16)));
  EXPECT_TRUE(all_close(x.grad(), mul(x.detach(), 2.0), 0, 0));
  EXPECT_EQ(x.grad().dtype(), DType::BF16);
}

// ---- in place ----------------------------------------------------------------------------------

TEST(ElementwiseInPlace, ValuesBroadcastAndVersion) {
  const Tensor x = randn_as({3, 4}, DType::F32, 70);
  const Tensor orig = x.clone();
  const Tensor row = randn_as({4}, DType::F32, 71);
  const uint64_t v0 = x.version();
  add_(x, row, 0.5);
  EXPECT_TRUE(all_close(x, naive_binary(orig, row, [](double p, double q) { return p + 0.5 * q; }),
                        1e-6, 1e-6));
  EXPECT_GT(x.version(), v0);
  const Tensor y = orig.clone();
  sub_(y, row);
  EXPECT_TRUE(all_close(y, naive_binary(orig, row, std::minus<double>()), 1e-6, 1e-6));
  mul_(y, row);
  div_(y, row);
  add_(y, row);
  EXPECT_TRUE(all_close(y, orig, 1e-5, 1e-5));
  add_(y, 1.0);
  mul_(y, 2.0);
  EXPECT_TRUE(all_close(y, naive_unary(orig, [](double v) { return (v + 1) * 2; }), 1e-5, 1e-5));
  clamp_(y, -0.5, 0.5);
  EXPECT_TRUE(
      all_close(y, naive_unary(orig, [](double v) { return std::clamp((v + 1) * 2, -0.5, 0.5); }),
                1e-5, 1e-5));
  // other must broadcast to self's shape, not the other way round.
  const Tensor col = randn_as({3, 1}, DType::F32, 72);
  EXPECT_THROW(add_(col, x), mt::Error);
  EXPECT_THROW(add_(x, randn_as({4}, DType::F64, 73)), mt::Error);
  EXPECT_THROW(add_(x.slice(1, 0, 1).expand({3, 4}), x), mt::Error);  // overlapping self
}

TEST(ElementwiseInPlace, WritesThroughStridedSelfAndHandlesAliasing) {
  const Tensor base = randn_as({4, 4}, DType::F64, 74);
  const Tensor orig = base.clone();
  add_(base.t(), ones({4}, kF64));  // adds 1 to each column of base's transpose = row of base
  auto vb = base.to_vector<double>(), vo = orig.to_vector<double>();
  for (size_t i = 0; i < vb.size(); ++i) EXPECT_EQ(vb[i], vo[i] + 1.0);
  // other overlapping self in a different layout is read before being written.
  const Tensor sq = orig.clone();
  add_(sq, sq.t());
  const auto vs = sq.to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(vs[i * 4 + j], vo[i * 4 + j] + vo[j * 4 + i]);
  // a slice of self
  const Tensor half = orig.clone();
  mul_(half.slice(0, 0, 2), half.slice(0, 2, 4));
  const auto vh = half.to_vector<double>();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(vh[i], vo[i] * vo[i + 8]);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(vh[i], vo[i]);
}

TEST(ElementwiseInPlace, RefusesTensorsThatRequireGradUnderGradMode) {
  const Tensor w = randn64({3}, 75);  // requires grad
  try {
    add_(w, ones({3}, kF64));
    FAIL() << "expected an error";
  } catch (const mt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("add_"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("requires grad"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mul_(w, 2.0), mt::Error);
  EXPECT_THROW(clamp_(w, 0.0, 1.0), mt::Error);
  {
    NoGradGuard no_grad;  // an optimizer step
    const auto before = w.to_vector<double>();
    add_(w, ones({3}, kF64), -0.1);
    const auto after = w.to_vector<double>();
    for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(after[i], before[i] - 0.1);
  }
}

TEST(ElementwiseInPlace, ModifyingASavedTensorMakesBackwardThrow) {
  const Tensor x = randn64({3}, 76);
  const Tensor y = exp(x);  // saves its output
  {
    NoGradGuard no_grad;
    add_(y.detach(), 1.0);
  }
  EXPECT_THROW(y.backward(ones({3}, kF64)), mt::Error);
}

TEST(ElementwiseInPlace, IntegerInPlace) {
  const TensorOptions i64 = TensorOptions{}.with_dtype(DType::I64);
  const Tensor a = from_vector<int64_t>({1, 2, 3}, {3}, i64);
  add_(a, from_vector<int64_t>({10, 20, 30}, {3}, i64), 2.0);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{21, 42, 63}));
  div_(a, from_vector<int64_t>({2}, {1}, i64));
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{10, 21, 31}));
  EXPECT_THROW(add_(a, a, 0.5), mt::Error);
  EXPECT_THROW(div_(a, zeros({3}, i64)), mt::Error);
}

}  // namespace
}  // namespace mt::runtime
