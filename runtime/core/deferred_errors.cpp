#include "runtime/core/deferred_errors.h"

#include <mutex>
#include <vector>

#include "runtime/core/error.h"

namespace mt::runtime {
namespace {

struct Deferred {
  std::unique_ptr<PendingVerdict> verdict;
  BadElementMessage message;
};

struct Queue {
  std::mutex mutex;
  std::vector<Deferred> pending;  // in the order they were queued
};

Queue& queue() {
  static auto* q = new Queue;  // outlives static tensors: verdicts may hold device buffers
  return *q;
}

}  // namespace

void defer_verdict(std::unique_ptr<PendingVerdict> verdict, BadElementMessage message) {
  MT_CHECK(verdict != nullptr && message, "defer_verdict: expected a verdict and a message");
  {
    Queue& q = queue();
    std::lock_guard lock(q.mutex);
    q.pending.push_back({std::move(verdict), std::move(message)});
  }
  raise_arrived_errors();  // keeps the queue as short as the work in flight
}

void raise_arrived_errors() {
  Queue& q = queue();
  std::optional<std::pair<BadElementMessage, BadElement>> first_failure;
  {
    std::lock_guard lock(q.mutex);
    // Read verdicts lose their entry, also when a device error escapes from arrived().
    auto drop_read = [&] {
      std::erase_if(q.pending, [](const Deferred& d) { return !d.verdict; });
    };
    try {
      for (Deferred& d : q.pending) {
        if (!d.verdict->arrived()) continue;
        const std::optional<BadElement> bad = d.verdict->bad_element();
        d.verdict.reset();
        if (bad && !first_failure) first_failure.emplace(std::move(d.message), *bad);
      }
    } catch (...) {
      drop_read();
      throw;
    }
    drop_read();
  }
  // The message is composed outside the lock (it may format tensors' shapes, never wait).
  if (first_failure) MT_FAIL(first_failure->first(first_failure->second.position,
                                                  first_failure->second.value));
}

int64_t pending_verdicts() {
  Queue& q = queue();
  std::lock_guard lock(q.mutex);
  return int64_t(q.pending.size());
}

}  // namespace mt::runtime
