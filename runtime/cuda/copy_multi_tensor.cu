// CUDA kernel of copy_multi_tensor_ (runtime/kernels/copy.h): the pairs of one (source dtype,
// destination dtype) go up to kMaxTensorsPerLaunch per launch (multi_tensor.cuh); each block
// converts kCopyBlockElems elements of one pair, by 16-byte packs when every pointer of the launch
// is aligned for them.
#include <utility>

#include "runtime/cuda/loops.cuh"
#include "runtime/cuda/multi_tensor.cuh"
#include "runtime/cuda/packed.cuh"
#include "runtime/kernels/copy.h"

namespace mt::runtime::cuda {
namespace {

constexpr int64_t kCopyBlockElems = 8 * 1024;

template <class S, class D>
struct CopyTable {
  const S* src[kMaxTensorsPerLaunch];
  D* dst[kMaxTensorsPerLaunch];
  TensorBlocks blocks;
};

template <class S, class D, int V>
__global__ void copy_blocks(const __grid_constant__ CopyTable<S, D> a) {
  int64_t begin, end;
  const int t = a.blocks.locate(blockIdx.x, kCopyBlockElems, begin, end);
  const S* src = a.src[t];
  D* dst = a.dst[t];
  const int64_t packs_end = begin / V + (end - begin) / V;  // begin is a multiple of V
  for (int64_t i = begin / V + threadIdx.x; i < packs_end; i += blockDim.x) {
    const Pack<S, V> in = load_pack<V>(src, i);
    Pack<D, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = convert<D>(in.v[j]);
    store_pack<V>(dst, i, out);
  }
  for (int64_t i = packs_end * V + threadIdx.x; i < end; i += blockDim.x)
    dst[i] = convert<D>(src[i]);
}

// The pairs k of `pairs` whose dtypes are (S, D), in launches.
template <class S, class D>
void copy_pairs_of(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts,
                   const std::vector<size_t>& pairs) {
  constexpr int V = pack_width<S, D>();
  CopyTable<S, D> table;
  auto flush = [&] {
    launch_blocks<V>(table.blocks, [&](auto width) {
      copy_blocks<S, D, decltype(width)::value>
          <<<unsigned(table.blocks.blocks), kThreads, 0, current_stream()>>>(table);
      MT_CUDA_CHECK_LAUNCH();
    });
  };
  for (size_t k : pairs) {
    const S* src = ptr<S>(srcs[k]);
    D* dst = ptr<D>(dsts[k]);
    const int slot = table.blocks.add(srcs[k].numel(), kCopyBlockElems, packable<V>(src, dst));
    table.src[slot] = src;
    table.dst[slot] = dst;
    if (table.blocks.full()) flush();
  }
  flush();
}

void copy_multi_tensor(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts) {
  MT_CHECK(srcs.size() == dsts.size(), "copy_multi_tensor_: ", srcs.size(), " sources for ",
           dsts.size(), " destinations");
  // The nonempty pairs, grouped by (source dtype, destination dtype) in order of appearance.
  std::vector<std::pair<std::pair<DType, DType>, std::vector<size_t>>> groups;
  for (size_t k = 0; k < srcs.size(); ++k) {
    const Tensor &s = srcs[k], &d = dsts[k];
    check_on_current_device(s, "copy_multi_tensor_");
    check_on_current_device(d, "copy_multi_tensor_");
    MT_CHECK(s.is_contiguous() && d.is_contiguous() && s.numel() == d.numel() &&
                 s.is_floating_point() && d.is_floating_point(),
             "copy_multi_tensor_: pair ", k, ": expected contiguous floating tensors of one size, "
             "got ", s.shape(), " ", s.dtype(), " and ", d.shape(), " ", d.dtype());
    if (s.numel() == 0) continue;
    const std::pair<DType, DType> key{s.dtype(), d.dtype()};
    size_t g = 0;
    while (g < groups.size() && groups[g].first != key) ++g;
    if (g == groups.size()) groups.push_back({key, {}});
    groups[g].second.push_back(k);
  }
  for (const auto& [key, pairs] : groups) {
    MT_CUDA_DISPATCH_FLOATING(key.first, "copy_multi_tensor_", S, [&] {
      MT_CUDA_DISPATCH_FLOATING(key.second, "copy_multi_tensor_", D,
                                [&] { copy_pairs_of<S, D>(srcs, dsts, pairs); });
    });
  }
}

MT_REGISTER_KERNEL(copy_multi_tensor_kernel, DeviceType::CUDA, copy_multi_tensor);

}  // namespace
}  // namespace mt::runtime::cuda
