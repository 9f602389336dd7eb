// all_gather_strings: lengths first, then the bytes packed in i64 words padded to the longest.
#include "parallel/comm/object_collectives.h"

#include <algorithm>
#include <cstring>

#include "runtime/ops/factory.h"

namespace mt::parallel {

using runtime::DType;

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine,
                                            const std::string& name) {
  const int n = group.size();
  Tensor my_len = runtime::full({1}, double(mine.size()), {DType::I64});
  Tensor lengths = Tensor::empty({n}, {DType::I64});
  group.all_gather_into(lengths, my_len, name + ".lengths");
  const int64_t* len = lengths.data<int64_t>();
  const int64_t longest = *std::max_element(len, len + n);
  const int64_t words = (longest + 7) / 8;
  Tensor packed = runtime::zeros({words}, {DType::I64});
  if (!mine.empty()) std::memcpy(packed.data_ptr(), mine.data(), mine.size());
  Tensor all = Tensor::empty({n * words}, {DType::I64});
  group.all_gather_into(all, packed, name);
  std::vector<std::string> out(static_cast<size_t>(n));
  const char* bytes = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) {
    out[size_t(r)].assign(bytes + size_t(r) * size_t(words) * 8, size_t(len[r]));
  }
  return out;
}

std::vector<double> all_gather_values(ProcessGroup& group, const std::vector<double>& mine,
                                      const std::string& name) {
  const std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double));
  std::vector<double> out;
  for (const std::string& theirs : all_gather_strings(group, bytes, name)) {
    const size_t n = theirs.size() / sizeof(double);
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, theirs.data(), n * sizeof(double));
  }
  return out;
}

}  // namespace mt::parallel
