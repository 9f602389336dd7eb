// Hugging Face export and import of Llama checkpoints (what `mt_checkpoint export-hf` and
// `import-hf` run).
//
// export_hf: the model.* tensors of a training checkpoint -> `out/` with model.safetensors (or
// shards + model.safetensors.index.json above max_shard_bytes) and config.json, in transformers'
// names and q/k layout (models/llama/hf_checkpoint.h), so LlamaForCausalLM.from_pretrained(out)
// loads it. The architecture comes from `args`, else from the one the checkpoint saved
// (/state/architecture: a config.json, so import-hf then export-hf gives the same files back),
// else, for checkpoints older than that, from the saved job config (model flavor, vocab = the
// embedding's rows). Tied embeddings are exported without lm_head.weight, as transformers saves.
// import_hf: such a folder -> a model-only checkpoint folder (step_dir, e.g. imported/step-0) with
// the config.json as its architecture, that `[checkpoint] initial_load_path` (with model.flavor =
// "from_checkpoint") or `mt_generate --checkpoint` loads; step_dir must be new (or an empty
// folder): nothing in a folder that holds anything is replaced. Either way, a dtype asked for must
// be a floating one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

#include "models/llama/model_args.h"
#include "runtime/core/dtype.h"

namespace mt::train {

struct HfExportOptions {
  std::optional<runtime::DType> dtype;             // default: as stored
  int64_t max_shard_bytes = int64_t(5) << 30;      // transformers' default 5 GB shards
  std::optional<models::llama::ModelArgs> args;    // default: from the saved job config
};

void export_hf(const std::filesystem::path& step_dir, const std::filesystem::path& out,
               const HfExportOptions& options = {});

void import_hf(const std::filesystem::path& hf_dir, const std::filesystem::path& step_dir,
               runtime::DType dtype = runtime::DType::F32);

}  // namespace mt::train
