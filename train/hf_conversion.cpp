// export_hf / import_hf (see hf_conversion.h).
#include "train/hf_conversion.h"

#include <fstream>
#include <unistd.h>

#include "checkpoint/consolidate.h"
#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/h5_dtype.h"
#include "checkpoint/safetensors.h"
#include "models/llama/hf_checkpoint.h"
#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "train/config/load.h"
#include "train/model_spec.h"
#include "train/trainer.h"

namespace mt::train {

namespace fs = std::filesystem;
using runtime::DType;
using runtime::Tensor;

namespace {

constexpr const char* kModel = "model.";

// The architecture of the model that saved `index` (/state/architecture); for checkpoints
// written before it was saved, the job's config, vocab from the embedding's rows.
models::llama::ModelArgs args_of(const checkpoint::Index& index, const fs::path& dir) {
  if (const auto saved = saved_architecture(index.values, dir)) {
    return models::llama::args_from_hf_config_text(saved->text, saved->where);
  }
  auto it = index.values.find("config");
  MT_CHECK(it != index.values.end() && std::holds_alternative<std::string>(it->second),
           "export-hf: checkpoint ", dir.string(),
           " has neither a saved architecture (/state/architecture) nor a saved job config "
           "(/state/config)");
  int64_t vocab = -1;
  for (const checkpoint::IndexChunk& c : index.chunks) {
    if (c.meta.fqn == "model.tok_embeddings.weight") vocab = c.meta.global_shape[0];
  }
  MT_CHECK(vocab > 0, "export-hf: checkpoint ", dir.string(),
           " has no model.tok_embeddings.weight (not a Llama checkpoint?)");
  const fs::path tmp = fs::temp_directory_path() / ("mt_export_config_" + std::to_string(getpid()) + ".toml");
  std::ofstream(tmp) << std::get<std::string>(it->second);
  config::JobConfig job;
  try {
    job = config::load_config(tmp);
  } catch (...) {
    fs::remove(tmp);
    throw;
  }
  fs::remove(tmp);
  MT_CHECK(job.model.name == "llama3", "export-hf: the checkpoint's model is ", job.model.name,
           "; only llama3 converts to Hugging Face");
  models::ModelSpec spec = model_spec_for(job, vocab);
  return std::any_cast<models::llama::ModelArgs>(*spec.args);
}

const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    default: return "float32";
  }
}

}  // namespace

void export_hf(const fs::path& step_dir, const fs::path& out, const HfExportOptions& options) {
  if (options.dtype) checkpoint::check_weight_dtype(*options.dtype, "export-hf --dtype");
  const checkpoint::CheckpointSummary summary = checkpoint::inspect_checkpoint(step_dir);
  MT_CHECK(summary.checksum_errors.empty(), "export-hf: checkpoint ", step_dir.string(),
           " is corrupted: ", summary.checksum_errors.front());
  const models::llama::ModelArgs args = options.args ? *options.args : args_of(summary.index, step_dir);
  models::llama::Weights ours;
  DType stored = DType::F32;
  for (const checkpoint::TensorSummary& t : summary.tensors) {
    if (!t.fqn.starts_with(kModel)) continue;
    Tensor w = checkpoint::read_whole_tensor(step_dir, t.fqn);
    if (options.dtype) w = w.to(*options.dtype);
    stored = w.dtype();
    ours[t.fqn.substr(std::string(kModel).size())] = w;
  }
  const models::llama::Weights hf = models::llama::to_hf(ours, args);
  checkpoint::write_safetensors_folder(out, hf, options.max_shard_bytes);
  std::ofstream(out / "config.json") << models::llama::hf_config_json(args, torch_dtype_name(stored));
}

void import_hf(const fs::path& hf_dir, const fs::path& step_dir, DType dtype) {
  // A checkpoint save replaces its folder whole: never over a folder that holds anything.
  MT_CHECK(!fs::exists(step_dir) || (fs::is_directory(step_dir) && fs::is_empty(step_dir)),
           "import-hf: ", step_dir.string(),
           " already exists; name a new folder (nothing was written)");
  checkpoint::check_weight_dtype(dtype, "import-hf --dtype");
  const models::llama::ModelArgs args = models::llama::args_from_hf_config(hf_dir / "config.json");
  const models::llama::Weights ours =
      models::llama::from_hf(checkpoint::read_safetensors_folder(hf_dir), args);
  checkpoint::CheckpointState state;
  for (const auto& [name, w] : ours) {
    Tensor t = runtime::is_floating(w.dtype()) ? w.to(dtype) : w;
    state.tensors.push_back(checkpoint::whole(kModel + name, t));
  }
  state.values["step"] = int64_t(0);
  state.values["model_only"] = int64_t(1);
  state.values[kArchitectureValue] = models::llama::hf_config_json(args, torch_dtype_name(dtype));
  auto world = parallel::MpiProcessGroup::world();
  fs::create_directories(step_dir.parent_path().empty() ? fs::path(".") : step_dir.parent_path());
  checkpoint::save_checkpoint(step_dir, state, *world);
}

}  // namespace mt::train
