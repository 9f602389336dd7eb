#include "train/float8_setup.h"

#include <sstream>
#include <utility>
#include <vector>

#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "runtime/kernels/float8.h"

namespace mt::train {

namespace {

constexpr size_t kNamesPerReason = 3;  // the log names a few linears per reason, then counts

// "a, b, c and 4 more".
std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kNamesPerReason; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > kNamesPerReason)
    out += " and " + std::to_string(names.size() - kNamesPerReason) + " more";
  return out;
}

}  // namespace

void check_float8_device(const config::JobConfig& job, runtime::Device device) {
  if (!job.float8.enable) return;
  const std::string device_text = "training.device = \"" + job.training.device + "\" (" +
                                  job.where("training.device") + ") runs on " +
                                  runtime::device_description(device);
  if (device.is_cpu()) {
    MT_CHECK(job.float8.emulate, "train: quantize.linear.float8.enable = true (",
             job.where("quantize.linear.float8.enable"), ") but ", device_text,
             ", which has no FP8 GEMMs: float8 training needs a GPU with FP8 tensor cores "
             "(compute capability 8.9+); set quantize.linear.float8.emulate = true to run the "
             "exact CPU reference instead (for tests and debugging)");
    return;
  }
  if (auto why = runtime::float8_gemm_unsupported_kernel(device)) {
    MT_FAIL("train: quantize.linear.float8.enable = true (",
            job.where("quantize.linear.float8.enable"), ") but ", device_text,
            ", which cannot run FP8 GEMMs: ", *why);
  }
}

std::string apply_float8_training(runtime::nn::Module& model, const config::JobConfig& job,
                                  runtime::Device device) {
  return apply_float8_training(std::vector<runtime::nn::Module*>{&model}, job, device);
}

std::string apply_float8_training(const std::vector<runtime::nn::Module*>& modules,
                                  const config::JobConfig& job, runtime::Device device) {
  MT_CHECK(job.float8.enable, "apply_float8_training: quantize.linear.float8.enable is false");
  check_float8_device(job, device);
  const runtime::Float8Recipe recipe = job.float8.recipe_name == "rowwise"
                                           ? runtime::Float8Recipe::Rowwise
                                           : runtime::Float8Recipe::Tensorwise;  // validated
  runtime::nn::Float8Conversion all;
  for (runtime::nn::Module* m : modules) {
    runtime::nn::Float8Conversion c =
        runtime::nn::convert_linears_to_float8(*m, device, job.float8.filter_fqns, recipe);
    all.converted.insert(all.converted.end(), c.converted.begin(), c.converted.end());
    all.skipped.insert(all.skipped.end(), c.skipped.begin(), c.skipped.end());
  }
  return float8_conversion_text(all, job.float8.recipe_name, job.training.mixed_precision_param);
}

std::string float8_conversion_text(const runtime::nn::Float8Conversion& conversion,
                                   const std::string& recipe, const std::string& high_precision) {
  std::ostringstream os;
  const size_t n = conversion.converted.size();
  os << "float8: " << n << " linear" << (n == 1 ? "" : "s") << " (" << recipe << ")";
  if (conversion.skipped.empty()) return os.str();
  // The skipped linears grouped by reason, in the order the reasons first appear.
  std::vector<std::pair<std::string, std::vector<std::string>>> by_reason;
  for (const auto& [fqn, reason] : conversion.skipped) {
    auto it = by_reason.begin();
    while (it != by_reason.end() && it->first != reason) ++it;
    if (it == by_reason.end()) it = by_reason.insert(it, {reason, {}});
    it->second.push_back(fqn);
  }
  os << ", " << conversion.skipped.size() << " left in " << high_precision << ": ";
  for (size_t i = 0; i < by_reason.size(); ++i) {
    os << (i ? "; " : "") << some_names(by_reason[i].second) << " (" << by_reason[i].first << ")";
  }
  return os.str();
}

}  // namespace mt::train
