// mt_checkpoint: look at and convert distributed checkpoints without training code.
//
//   mt_checkpoint inspect STEP_DIR                 tensors, shapes, dtypes, sizes, rank files,
//                                                  values; verifies every checksum (exit 1 if bad)
//   mt_checkpoint consolidate STEP_DIR OUT.h5 [--dtype bfloat16|float32|float16]
//                                                  one HDF5 file with whole tensors and the values
//   mt_checkpoint export-hf STEP_DIR OUT_DIR [--dtype D] [--max-shard-bytes N]
//                                                  Hugging Face safetensors + config.json (Llama)
//   mt_checkpoint import-hf HF_DIR OUT_STEP_DIR [--dtype D (float32)]
//                                                  a model-only checkpoint (for initial_load_path)
//
// STEP_DIR is a step-N folder (or a checkpoint folder: its latest complete step is used).
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/consolidate.h"
#include "checkpoint/h5_dtype.h"
#include "checkpoint/manager.h"
#include "runtime/core/error.h"
#include "tools/flags.h"
#include "train/hf_conversion.h"

namespace {

namespace fs = std::filesystem;
using namespace mt;

void usage(std::ostream& os) {
  os << "usage: mt_checkpoint inspect STEP_DIR\n"
        "       mt_checkpoint consolidate STEP_DIR OUT.h5 [--dtype float32|bfloat16|float16]\n"
        "       mt_checkpoint export-hf STEP_DIR OUT_DIR [--dtype D] [--max-shard-bytes N]\n"
        "       mt_checkpoint import-hf HF_DIR OUT_STEP_DIR [--dtype D (float32)]\n"
        "STEP_DIR: a step-N checkpoint folder, or a folder of them (the latest complete one).\n";
}

int run(int argc, char** argv) {
  tools::FlagReader flags("mt_checkpoint", argc, argv);
  std::vector<std::string> positional;
  std::optional<runtime::DType> dtype;
  int64_t max_shard_bytes = int64_t(5) << 30;
  while (flags.next()) {
    if (flags.is("--help") || flags.is("-h")) {
      usage(std::cout);
      return 0;
    } else if (flags.is("--dtype")) {
      dtype = checkpoint::dtype_from_storage_name(flags.value(), "mt_checkpoint --dtype");
    } else if (flags.is("--max-shard-bytes")) {
      max_shard_bytes = flags.int_value();
    } else if (flags.is_positional()) {
      positional.push_back(flags.arg());
    } else {
      flags.unknown();
    }
  }
  if (positional.empty()) {
    usage(std::cerr);
    return 2;
  }
  const std::string& command = positional[0];
  if (command == "inspect" && positional.size() == 2) {
    const checkpoint::CheckpointSummary s = checkpoint::inspect_checkpoint(checkpoint::resolve_checkpoint_dir(positional[1], "mt_checkpoint"));
    checkpoint::print_summary(s, std::cout);
    return s.checksum_errors.empty() ? 0 : 1;
  }
  if (command == "consolidate" && positional.size() == 3) {
    checkpoint::consolidate_checkpoint(checkpoint::resolve_checkpoint_dir(positional[1], "mt_checkpoint"), positional[2], dtype);
    std::cout << "wrote " << positional[2] << "\n";
    return 0;
  }
  if (command == "export-hf" && positional.size() == 3) {
    train::HfExportOptions options;
    options.dtype = dtype;
    options.max_shard_bytes = max_shard_bytes;
    train::export_hf(checkpoint::resolve_checkpoint_dir(positional[1], "mt_checkpoint"),
                     positional[2], options);
    std::cout << "wrote " << positional[2] << " (safetensors + config.json)\n";
    return 0;
  }
  if (command == "import-hf" && positional.size() == 3) {
    train::import_hf(positional[1], positional[2], dtype.value_or(runtime::DType::F32));
    std::cout << "wrote " << positional[2] << " (a model-only checkpoint)\n";
    return 0;
  }
  std::cerr << "mt_checkpoint: unknown command or wrong arguments: " << command << "\n";
  usage(std::cerr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mt::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
