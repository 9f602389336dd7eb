// error_of (see errors.h).
#include "tests/testing/errors.h"

#include <gtest/gtest.h>

#include "runtime/core/error.h"

namespace mt::testing {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an mt::Error";
  return "";
}

}  // namespace mt::testing
