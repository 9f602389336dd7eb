#include "runtime/nn/float8_conversion.h"

#include "runtime/core/device_runtime.h"
#include "runtime/nn/linear.h"
#include "runtime/ops/float8.h"

namespace mt::runtime::nn {

Float8Conversion convert_linears_to_float8(Module& root, Device device,
                                           const std::vector<std::string>& filter_fqns,
                                           Float8Recipe recipe) {
  if (auto why = float8_gemm_unsupported_kernel(device)) {
    MT_FAIL("float8 training: ", device_description(device), " cannot run FP8 GEMMs: ", *why);
  }
  Float8Conversion result;
  for (auto& [fqn, module] : root.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(module);
    if (linear == nullptr) continue;
    const std::string name = fqn.empty() ? "(root)" : fqn;
    bool filtered = false;
    for (const std::string& f : filter_fqns) filtered |= !f.empty() && fqn.find(f) != fqn.npos;
    if (filtered) {
      result.skipped.emplace_back(name, "filtered");
      continue;
    }
    const auto why = float8_linear_unsupported(device, linear->weight.size(1),
                                               linear->weight.size(0));
    if (why) {
      result.skipped.emplace_back(name, *why);
      continue;
    }
    linear->float8 = true;
    linear->float8_recipe = recipe;
    result.converted.push_back(name);
  }
  return result;
}

}  // namespace mt::runtime::nn
