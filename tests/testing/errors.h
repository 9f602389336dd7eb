// Catching the mt::Error a call throws, to check its message.
#pragma once

#include <functional>
#include <string>

namespace mt::testing {

// The message of the mt::Error `fn` throws; "" and a test failure when it throws none.
std::string error_of(const std::function<void()>& fn);

}  // namespace mt::testing
