#include "models/registry.h"

#include <utility>

#include "models/llama/model_args.h"
#include "models/llama/spec.h"
#include "models/moe/model_args.h"
#include "models/moe/spec.h"
#include "runtime/core/error.h"

namespace mt::models {

Tensor default_cross_entropy(const Tensor& logits, const Tensor& targets,
                             runtime::Reduction reduction) {
  return runtime::cross_entropy(logits, targets, -100, reduction,
                                runtime::accumulation_dtype(logits.dtype()));
}

namespace {

struct Entry {
  const char* name;
  std::vector<std::string> (*flavors)();
  ModelSpec (*make)(const std::string& flavor);
  // Null where the model saves no architecture.
  ModelSpec (*from_architecture)(const std::string& text, const std::string& where);
};

const std::vector<Entry>& entries() {
  static const std::vector<Entry> table{
      {"llama3", &llama::flavor_names, &llama::make_model_spec,
       &llama::make_model_spec_from_architecture},
      {"deepseek_v3", &moe::flavor_names, &moe::make_model_spec, nullptr},
  };
  return table;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

const Entry& find(const std::string& name) {
  for (const auto& e : entries()) {
    if (name == e.name) return e;
  }
  MT_FAIL("model registry: unknown model name '", name, "'; valid names: ", join(model_names()));
}

}  // namespace

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const auto& e : entries()) out.emplace_back(e.name);
  return out;
}

std::vector<std::string> model_flavors(const std::string& name) { return find(name).flavors(); }

ModelSpec get_model_spec(const std::string& name, const std::string& flavor) {
  const Entry& e = find(name);
  const auto flavors = e.flavors();
  bool known = false;
  for (const auto& f : flavors) known = known || f == flavor;
  MT_CHECK(known, "model registry: unknown flavor '", flavor, "' for model '", name,
           "'; valid flavors: ", join(flavors));
  return e.make(flavor);
}

ModelSpec model_spec_from_architecture(const std::string& name, const std::string& architecture,
                                       const std::string& where) {
  const Entry& e = find(name);
  MT_CHECK(e.from_architecture != nullptr, where, ": model '", name,
           "' saves no architecture, so flavor \"", kFlavorFromCheckpoint,
           "\" cannot build it; name one of its flavors: ", join(e.flavors()));
  return e.from_architecture(architecture, where);
}

}  // namespace mt::models
