// CUDA dropout (runtime/kernels/dropout.h): exactly the CPU kernel's mask for the same key.
// runtime/core/rng.cpp's Philox4x32-10 and key derivation are host-only, so they are written
// again here as __host__ __device__ code; every call checks on the host that this copy gives
// runtime::uniform_at's values (two indices), so the two can never drift apart silently.
#include "runtime/core/rng.h"
#include "runtime/cuda/loops.cuh"
#include "runtime/kernels/dropout.h"

namespace mt::runtime::cuda {
namespace {

struct PhiloxKey {
  uint32_t k0, k1;  // the Philox key
  uint32_t offset_lo, offset_hi;
};

// Philox4x32-10 (as runtime::philox4x32_10); returns the first two words.
__host__ __device__ inline void philox_2x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                            uint32_t k0, uint32_t k1, uint32_t& r0, uint32_t& r1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0;
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  r0 = c0;
  r1 = c1;
}

// runtime::uniform_at(key, i): 53 random bits scaled to [0, 1) (exact in f64).
__host__ __device__ inline double uniform_of(const PhiloxKey& key, uint64_t i) {
  uint32_t r0, r1;
  philox_2x32(uint32_t(i), uint32_t(i >> 32), key.offset_lo, key.offset_hi, key.k0, key.k1, r0, r1);
  const uint64_t bits = ((uint64_t(r0) << 32) | r1) >> 11;
  return double(bits) * (1.0 / 9007199254740992.0);
}

// The Philox key and counter words of runtime::philox(key, .) (rng.cpp: splitmix64 mixing).
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

PhiloxKey device_key(const RandomKey& key) {
  const uint64_t k = splitmix64(key.seed ^ splitmix64(key.stream));
  const PhiloxKey pk{uint32_t(k), uint32_t(k >> 32), uint32_t(key.offset),
                     uint32_t(key.offset >> 32)};
  MT_CHECK(
      uniform_of(pk, 0) == uniform_at(key, 0) && uniform_of(pk, 12345) == uniform_at(key, 12345),
      "dropout: the CUDA Philox disagrees with runtime/core/rng.cpp (update "
      "runtime/cuda/dropout.cu)");
  return pk;
}

void dropout(const Tensor& x, double p, const RandomKey& key, Tensor& out) {
  check_on_current_device(x, "dropout");
  check_on_current_device(out, "dropout");
  const PhiloxKey pk = device_key(key);
  MT_CUDA_DISPATCH_FLOATING(x.dtype(), "dropout", T, [&] {
    using C = acc_t<T>;
    const T* xp = ptr<T>(x);
    T* op = ptr<T>(out);
    const C keep_scale = C(1.0 / (1.0 - p));
    launch_linear(x.numel(), [=] __device__(int64_t i) {
      op[i] =
          uniform_of(pk, uint64_t(i)) < p ? convert<T>(C(0)) : convert<T>(C(C(xp[i]) * keep_scale));
    });
  });
}

MT_REGISTER_KERNEL(dropout_kernel, DeviceType::CUDA, dropout);

}  // namespace
}  // namespace mt::runtime::cuda
