// Re-running a recorded kernel by its table's name (mt_replay --all, parallel/comm/replay.h): a
// KernelTable registers a replayer for its op name when a backend registers a kernel
// (MT_REGISTER_KERNEL). The replayer rebuilds the call's arguments from a trace's record: tensor
// arguments from the caller's tensors, in the recorded order (inputs for const Tensor&, outputs
// for Tensor&), every other argument decoded from its code (kernel_arg_code, profiler.h), and
// dispatches through the table, so the replay runs the very kernel the step ran.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/core/profiler.h"
#include "runtime/core/tensor.h"

namespace mt::runtime {

// A recorded call to replay: the device, every argument's code, and the tensors standing in for
// the recorded inputs and outputs.
struct KernelCall {
  Device device;
  std::vector<std::string> args;
  std::vector<Tensor> inputs, outputs;
};

// Throws mt::Error when the call cannot be rebuilt (an argument type a trace does not record,
// codes or tensors that do not match the kernel's signature).
using KernelReplayer = std::function<void(const KernelCall&)>;

void register_kernel_replayer(const char* op, KernelReplayer replayer);
// The replayer of `op`; nullptr when no kernel table of that name has a kernel in this build.
const KernelReplayer* find_kernel_replayer(std::string_view op);

namespace replay_detail {

// Walks a KernelCall's argument codes and tensors in order.
class KernelArgDecoder {
 public:
  KernelArgDecoder(const KernelCall& call, const char* op) : call_(call), op_(op) {}

  template <class Declared>
  std::remove_cvref_t<Declared> next() {
    using T = std::remove_cvref_t<Declared>;
    constexpr bool output =
        std::is_lvalue_reference_v<Declared> && !std::is_const_v<std::remove_reference_t<Declared>>;
    const std::string& code = next_code();
    if constexpr (std::is_same_v<T, Tensor>) {
      if (code == "T-") return Tensor();
      expect(code == "T", code, "a tensor");
      return next_tensor(output);
    } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
      expect(code.size() > 1 && code[0] == 'V', code, "a list of tensors");
      std::vector<Tensor> list(size_t(number(code.substr(1), code)));
      for (Tensor& t : list) t = next_tensor(output);
      return list;
    } else if constexpr (HasTracedArg<T>) {
      return TracedArg<T>::decode(*this, code);
    } else {
      return decode<T>(code);
    }
  }

  // For TracedArg::decode: the next recorded input tensor.
  Tensor next_input() { return next_tensor(false); }
  int64_t number(const std::string& text, const std::string& code) const {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    expect(!text.empty() && end != nullptr && *end == '\0', code, "a number");
    return v;
  }
  // The comma-separated numbers of text ("" for none).
  std::vector<int64_t> numbers(const std::string& text, const std::string& code) const {
    std::vector<int64_t> out;
    for (size_t begin = 0; begin < text.size();) {
      const size_t end = std::min(text.find(',', begin), text.size());
      out.push_back(number(text.substr(begin, end - begin), code));
      begin = end + 1;
    }
    return out;
  }
  void expect(bool ok, const std::string& code, const char* what) const {
    MT_CHECK(ok, op_, ": argument ", code_, " was recorded as '", code, "', the kernel takes ",
             what, " there");
  }

  // After the last argument: every recorded tensor was used.
  void finish() const {
    MT_CHECK(code_ == call_.args.size() && input_ == call_.inputs.size() &&
                 output_ == call_.outputs.size(),
             op_, ": the recorded call has ", call_.args.size(), " arguments, ",
             call_.inputs.size(), " inputs and ", call_.outputs.size(),
             " outputs; the kernel's signature used ", code_, ", ", input_, " and ", output_);
  }

 private:
  template <class T>
  T decode(const std::string& code) {
    if constexpr (std::is_same_v<T, bool>) {
      expect(code == "b0" || code == "b1", code, "a bool");
      return code == "b1";
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      const char kind = std::is_enum_v<T> ? 'e' : 'i';
      expect(code.size() > 1 && code[0] == kind, code,
             std::is_enum_v<T> ? "an enum" : "an integer");
      return static_cast<T>(number(code.substr(1), code));
    } else if constexpr (std::is_floating_point_v<T>) {
      expect(code.size() > 1 && code[0] == 'f', code, "a floating value");
      char* end = nullptr;
      const double v = std::strtod(code.c_str() + 1, &end);
      expect(end != nullptr && *end == '\0', code, "a floating value");
      return T(v);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      expect(!code.empty() && code[0] == 'L', code, "a list of integers");
      return numbers(code.substr(1), code);
    } else if constexpr (IsStdFunction<T>::value) {
      expect(code == "F", code, "a callback");
      return T([](auto&&...) { return typename T::result_type(); });
    } else {
      static_assert(requires {
        typename T::value_type;
        std::optional<typename T::value_type>{};
      });
      expect(!code.empty() && code[0] == 'o', code, "an optional");
      if (code.size() == 1) return T();
      return decode<typename T::value_type>(code.substr(1));
    }
  }

  const std::string& next_code() {
    MT_CHECK(code_ < call_.args.size(), op_, ": the recorded call has only ", call_.args.size(),
             " arguments");
    return call_.args[code_++];
  }
  Tensor next_tensor(bool output) {
    const std::vector<Tensor>& from = output ? call_.outputs : call_.inputs;
    size_t& i = output ? output_ : input_;
    MT_CHECK(i < from.size(), op_, ": the recorded call has only ", from.size(),
             output ? " outputs" : " inputs");
    return from[i++];
  }

  const KernelCall& call_;
  const char* op_;
  size_t code_ = 0, input_ = 0, output_ = 0;
};

template <class T>
inline constexpr bool kReplayableArg =
    std::is_same_v<T, Tensor> || std::is_same_v<T, std::vector<Tensor>> ||
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::vector<int64_t>> ||
    IsStdFunction<T>::value || HasTracedArg<T> || requires {
  typename T::value_type;
  requires std::is_same_v<T, std::optional<typename T::value_type>>;
  requires std::is_arithmetic_v<typename T::value_type>;
};

}  // namespace replay_detail

// The replayer of a kernel table with arguments Args: `dispatch(device, args...)` calls the table.
template <class... Args, class Dispatch>
KernelReplayer make_kernel_replayer(const char* op, Dispatch dispatch) {
  if constexpr ((replay_detail::kReplayableArg<std::remove_cvref_t<Args>> && ...)) {
    return [op, dispatch](const KernelCall& call) {
      replay_detail::KernelArgDecoder decoder(call, op);
      // Braced initialisation decodes the arguments left to right.
      std::tuple<std::remove_cvref_t<Args>...> values{decoder.template next<Args>()...};
      decoder.finish();
      std::apply([&](auto&... v) { dispatch(call.device, v...); }, values);
    };
  } else {
    return [op](const KernelCall&) {
      MT_FAIL(op,
              ": not replayable (an argument of a type traces do not record: the kernel "
              "takes structs or lists other than tensors)");
    };
  }
}

}  // namespace mt::runtime
