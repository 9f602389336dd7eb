// Errors raised by minititan: one exception type (and OutOfMemoryError, a kind of it), and
// MT_CHECK for argument validation.
//
// Every user-facing check names the op (or component) and what was expected and found, e.g.
//   MT_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got shape ", a.shape());
// Arguments are streamed with operator<<, so shapes, dtypes and devices print readably.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised when the host or a device cannot allocate a tensor's memory, so that a caller that knows
// what sized it (train: the batch, the sequence) can say what to change.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class T>
void put(std::ostream& os, const T& value) {
  os << value;
}
template <class T>
void put(std::ostream& os, const std::vector<T>& values) {  // shapes print as [2, 3]
  os << "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) os << ", ";
    put(os, values[i]);
  }
  os << "]";
}
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (put(os, args), ...);
  return os.str();
}
}  // namespace detail

}  // namespace mt

#define MT_CHECK(cond, ...)                                           \
  do {                                                                \
    if (!(cond)) [[unlikely]] {                                       \
      throw ::mt::Error(::mt::detail::concat(__VA_ARGS__));           \
    }                                                                 \
  } while (0)

#define MT_FAIL(...) throw ::mt::Error(::mt::detail::concat(__VA_ARGS__))
