#include "train/float8_setup.h"

#include <sstream>
#include <utility>
#include <vector>

#include "models/moe/experts.h"
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

bool float8_enabled(const config::JobConfig& job) {
  return job.float8.enable || !job.float8_grouped_mm.fqns.empty();
}

namespace {

// The device check of one float8 section: `key` names what turned it on.
void check_section_device(const config::JobConfig& job, runtime::Device device,
                          const std::string& key, const std::string& emulate_key, bool emulate) {
  const std::string device_text = "training.device = \"" + job.training.device + "\" (" +
                                  job.where("training.device") + ") runs on " +
                                  runtime::device_description(device);
  if (device.is_cpu()) {
    MT_CHECK(emulate, "train: ", key, " is set (", job.where(key), ") but ", device_text,
             ", which has no FP8 GEMMs: float8 training needs a GPU with FP8 tensor cores "
             "(compute capability 8.9+); set ", emulate_key, " = true to run the exact CPU "
             "reference instead (for tests and debugging)");
    return;
  }
  if (auto why = runtime::float8_gemm_unsupported_kernel(device)) {
    MT_FAIL("train: ", key, " is set (", job.where(key), ") but ", device_text,
            ", which cannot run FP8 GEMMs: ", *why);
  }
}

}  // namespace

void check_float8_device(const config::JobConfig& job, runtime::Device device) {
  if (job.float8.enable) {
    check_section_device(job, device, "quantize.linear.float8.enable",
                         "quantize.linear.float8.emulate", job.float8.emulate);
  }
  if (!job.float8_grouped_mm.fqns.empty()) {
    check_section_device(job, device, "quantize.grouped_mm.float8.fqns",
                         "quantize.grouped_mm.float8.emulate", job.float8_grouped_mm.emulate);
  }
}

namespace {

// `convert` (a conversion of one module) over every module, their results joined.
template <class Convert>
runtime::nn::Float8Conversion convert_each(const std::vector<runtime::nn::Module*>& modules,
                                           Convert&& convert) {
  runtime::nn::Float8Conversion all;
  for (runtime::nn::Module* m : modules) {
    runtime::nn::Float8Conversion c = convert(*m);
    all.converted.insert(all.converted.end(), c.converted.begin(), c.converted.end());
    all.skipped.insert(all.skipped.end(), c.skipped.begin(), c.skipped.end());
  }
  return all;
}

std::string apply(const std::vector<runtime::nn::Module*>& modules, const config::JobConfig& job,
                  runtime::Device device, bool whole_model) {
  MT_CHECK(float8_enabled(job), "apply_float8_training: no float8 section is enabled");
  check_float8_device(job, device);
  std::string text;
  if (job.float8.enable) {
    const runtime::Float8Recipe recipe = job.float8.recipe_name == "rowwise"
                                             ? runtime::Float8Recipe::Rowwise
                                             : runtime::Float8Recipe::Tensorwise;  // validated
    const runtime::nn::Float8Conversion linears = convert_each(modules, [&](runtime::nn::Module& m) {
      return runtime::nn::convert_linears_to_float8(m, device, job.float8.filter_fqns, recipe);
    });
    text = float8_conversion_text(linears, job.float8.recipe_name,
                                  job.training.mixed_precision_param);
  }
  const auto& fqns = job.float8_grouped_mm.fqns;
  if (fqns.empty()) return "float8: " + text;
  const runtime::nn::Float8Conversion experts = convert_each(modules, [&](runtime::nn::Module& m) {
    return models::moe::convert_experts_to_float8(m, device, fqns);
  });
  if (whole_model && experts.converted.empty() && experts.skipped.empty()) {
    std::string listed;
    for (const std::string& f : fqns) listed += (listed.empty() ? "\"" : ", \"") + f + "\"";
    MT_FAIL("train: quantize.grouped_mm.float8.fqns = [", listed, "] (",
            job.where("quantize.grouped_mm.float8.fqns"), ") matches no MoE routed experts of ",
            "model.name = \"", job.model.name, "\" (in deepseek_v3 they are layers.<i>.moe.experts; ",
            "\"experts\" selects all)");
  }
  const std::string experts_text = float8_conversion_text(
      experts, "rowwise", job.training.mixed_precision_param, "routed experts module");
  return "float8: " + (text.empty() ? experts_text : text + "; " + experts_text);
}

}  // namespace

std::string apply_float8_training(runtime::nn::Module& model, const config::JobConfig& job,
                                  runtime::Device device) {
  return apply({&model}, job, device, /*whole_model=*/true);
}

std::string apply_float8_training(const std::vector<runtime::nn::Module*>& stages,
                                  const config::JobConfig& job, runtime::Device device) {
  return apply(stages, job, device, /*whole_model=*/false);
}

std::string float8_conversion_text(const runtime::nn::Float8Conversion& conversion,
                                   const std::string& recipe, const std::string& high_precision,
                                   const std::string& noun) {
  std::ostringstream os;
  const size_t n = conversion.converted.size();
  os << n << " " << noun << (n == 1 ? "" : "s") << " (" << recipe << ")";
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
