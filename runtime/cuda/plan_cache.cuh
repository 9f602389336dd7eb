// A process-wide cache of library plans (cuBLASLt descriptors and the heuristic's algorithm),
// built once per problem key and kept for the process's life: GEMM shapes repeat every step.
#pragma once

#include <mutex>
#include <unordered_map>

namespace mt::runtime::cuda {

// The plan for `key`, made by make(key) the first time. One cache per (Key, Plan, Hash).
template <class Plan, class Key, class Hash, class Make>
const Plan& cached_plan(const Key& key, Make&& make) {
  static std::mutex mutex;
  static std::unordered_map<Key, Plan, Hash> plans;
  std::lock_guard lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make(key)).first;
  return it->second;
}

}  // namespace mt::runtime::cuda
