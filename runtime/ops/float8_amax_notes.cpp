#include "runtime/ops/float8_amax_notes.h"

#include <unordered_map>
#include <vector>

#include "runtime/ops/factory.h"

namespace mt::runtime {

// The notes of a scope, by storage id (unique in the process: a freed storage's id is never
// reused), each with the elements it covers and the storage version it was measured at. Their
// slots are taken in turn from a zeroed pool: one fill for many slots (a step of a Llama 1B
// takes 81), not a kernel launch each. The fill is queued on the current stream before any
// producer that takes a slot of the pool, and the producers (norms, SwiGLU) run on that stream:
// on CUDA only NCCL's collectives switch streams.
struct Float8AmaxNotes::Notes {
  static constexpr int64_t kPoolSlots = 256;
  struct Note {
    int64_t offset = 0, numel = 0;
    uint64_t version = 0;
    Tensor amax;
  };
  std::unordered_map<uint64_t, std::vector<Note>> by_storage;
  Tensor pool;  // f32 [kPoolSlots] on one device, zeroed; `taken` of them handed out
  int64_t taken = 0;

  Tensor take_slot(Device device) {
    if (!pool.defined() || taken == kPoolSlots || pool.device() != device) {
      pool = zeros({kPoolSlots}, TensorOptions{}.with_dtype(DType::F32).with_device(device));
      taken = 0;
    }
    return pool.narrow(0, taken++, 1);
  }
};

namespace {
thread_local Float8AmaxNotes::Notes* t_notes = nullptr;
}  // namespace

Float8AmaxNotes::Float8AmaxNotes() : previous_(t_notes), notes_(std::make_unique<Notes>()) {
  t_notes = notes_.get();
}

Float8AmaxNotes::~Float8AmaxNotes() { t_notes = previous_; }

Tensor float8_amax_slot(const Tensor& out) {
  if (t_notes == nullptr || !out.defined() || !out.is_contiguous() ||
      (out.dtype() != DType::F32 && out.dtype() != DType::BF16)) {
    return Tensor();
  }
  Tensor amax = t_notes->take_slot(out.device());
  t_notes->by_storage[out.storage()->id()].push_back(
      {out.offset(), out.numel(), out.version(), amax});
  return amax;
}

Tensor noted_float8_amax(const Tensor& x) {
  if (t_notes == nullptr || !x.defined() || !x.is_contiguous()) return Tensor();
  auto it = t_notes->by_storage.find(x.storage()->id());
  if (it == t_notes->by_storage.end()) return Tensor();
  for (const Float8AmaxNotes::Notes::Note& n : it->second) {
    if (n.offset == x.offset() && n.numel == x.numel() && n.version == x.version()) return n.amax;
  }
  return Tensor();
}

}  // namespace mt::runtime
