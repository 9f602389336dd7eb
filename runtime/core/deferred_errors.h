// Bad input that a device finds while the host has moved on: an id out of range, a target that
// is not a class. A device kernel validates its input on the device and queues the verdict; the
// host reads verdicts whenever it waits for the device anyway (Tensor::to(cpu), item(),
// to_vector(), synchronize()) and throws the first failure there, with the message the op
// composed. So no op makes the host wait just to validate, and bad input is still reported by
// name: at the latest by synchronize(), or by the next copy to the host on the stream the op ran
// on (train reads the loss at the end of every step, and checkpoints copy to the host). The queue
// is the process's: any thread's host wait may raise it. CPU kernels validate and throw at once;
// they queue nothing.
//
// Until the error is raised the op's output is unspecified (kernels skip the bad elements and
// never touch memory outside their tensors), so results computed from it must not be kept.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace mt::runtime {

// The message for an invalid element: its position in the op's flattened input, and its value.
using BadElementMessage = std::function<std::string(int64_t position, int64_t value)>;

struct BadElement {
  int64_t position = 0;
  int64_t value = 0;
};

// A verdict on its way from a device. arrived() must not wait; bad_element() is called once,
// after arrived() said true (or after the device was synchronised), and gives the first bad
// element, or nullopt when every element was valid.
class PendingVerdict {
 public:
  virtual ~PendingVerdict() = default;
  virtual bool arrived() = 0;
  virtual std::optional<BadElement> bad_element() = 0;
};

// Queues a verdict, then raises any failure that has already arrived.
void defer_verdict(std::unique_ptr<PendingVerdict> verdict, BadElementMessage message);

// Reads every verdict that has arrived and drops it; throws mt::Error with the message of the
// first (in queue order) that found a bad element. A failure is raised once.
void raise_arrived_errors();

// Verdicts queued and not yet read (for tests and diagnostics).
int64_t pending_verdicts();

}  // namespace mt::runtime
