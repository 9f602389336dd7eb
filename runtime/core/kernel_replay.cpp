// The registry of kernel replayers (see kernel_replay.h).
#include "runtime/core/kernel_replay.h"

#include <map>
#include <mutex>

namespace mt::runtime {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, KernelReplayer, std::less<>> replayers;
};

// Constructed on first use: kernels register from static initialisers in any order.
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: replays may run from static destructors' time
  return *r;
}

}  // namespace

void register_kernel_replayer(const char* op, KernelReplayer replayer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.replayers.insert_or_assign(op, std::move(replayer));
}

const KernelReplayer* find_kernel_replayer(std::string_view op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.replayers.find(op);
  return it == r.replayers.end() ? nullptr : &it->second;
}

}  // namespace mt::runtime
