#include "runtime/sparse/keyed_tensor.h"

namespace mt::runtime::sparse {

std::vector<int64_t> KeyedTensor::offset_per_key() const {
  std::vector<int64_t> out(length_per_key.size() + 1, 0);
  for (size_t k = 0; k < length_per_key.size(); ++k) out[k + 1] = out[k] + length_per_key[k];
  return out;
}

int64_t KeyedTensor::key_index(const std::string& key) const {
  for (size_t k = 0; k < keys.size(); ++k)
    if (keys[k] == key) return int64_t(k);
  MT_FAIL("KeyedTensor: no key '", key, "' (keys: ", keys, ")");
}

Tensor KeyedTensor::key_values(int64_t k) const {
  MT_CHECK(k >= 0 && k < int64_t(keys.size()), "KeyedTensor: key index ", k, " outside [0, ",
           keys.size(), ")");
  return values.narrow(1, offset_per_key()[k], length_per_key[k]);
}

Tensor KeyedTensor::operator[](const std::string& key) const { return key_values(key_index(key)); }

}  // namespace mt::runtime::sparse
