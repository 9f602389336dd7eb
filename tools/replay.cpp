// mt_replay: replays a traced step (an execution trace per rank, written by train with
// [profiling] execution_trace = true) on as many ranks, without the model
// (parallel/comm/replay.h): its collectives (--comms, the default), or its collectives and its
// kernels (--all):
//
//   mpirun -np N build/tools/mt_replay TRACE_DIR_OR_FILES... [--comms | --all]
//       [--allocation lazy|pre] [--scale-bytes K] [--iters N] [--no-overlap]
//
// TRACE_DIR holds rank-<R>.json (<dump_folder>/<save_traces_folder>/execution_trace/step_<S>);
// every rank reads every trace (the groups are rebuilt from their members) and replays its own.
// Rank 0 prints each call's recorded and replayed time, the replay's peak memory and a digest of
// every output (equal for both allocations); with --all also the kernels' times per name and the
// kernels it could not re-run, with why. --no-overlap runs every async call synchronously where
// it was issued: what the step would take if those overlapped nothing. A GPU trace (kernels on
// cuda, collectives over NCCL) replays on the GPUs: rank r on GPU r % (GPUs on its node), over an
// NCCL world.
#include "parallel/comm/replay.h"

#include <filesystem>
#include <iostream>

#include "parallel/comm/comm_trace.h"
#include "parallel/comm/launcher_env.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/nccl_process_group.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "tools/flags.h"

namespace {

using namespace mt;
namespace fs = std::filesystem;

std::vector<std::string> trace_files(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  for (const std::string& a : args) {
    if (!fs::is_directory(a)) {
      files.push_back(a);
      continue;
    }
    for (const auto& e : fs::directory_iterator(a))
      if (parallel::rank_of_file_name(e.path().filename().string(), ".json")) {
        files.push_back(e.path().string());
      }
  }
  MT_CHECK(!files.empty(), "mt_replay: no trace files (rank-<R>.json) in the arguments");
  return files;
}

int run(int argc, char** argv) {
  tools::FlagReader flags("mt_replay", argc, argv);
  std::vector<std::string> inputs;
  parallel::ReplayOptions o;
  while (flags.next()) {
    if (flags.is("--help") || flags.is("-h")) {
      std::cout << "usage: mpirun -np N mt_replay TRACE_DIR_OR_FILES... [--comms | --all] "
                   "[--allocation lazy|pre] [--scale-bytes K] [--iters N] [--no-overlap]\n";
      return 0;
    }
    if (flags.is("--comms")) {
      o.compute = false;
    } else if (flags.is("--all")) {
      o.compute = true;
    } else if (flags.is("--allocation")) {
      const std::string a = flags.value();
      MT_CHECK(a == "lazy" || a == "pre", "mt_replay: --allocation must be lazy or pre, got '", a,
               "'");
      o.allocation = a == "lazy" ? parallel::ReplayOptions::Allocation::Lazy
                                 : parallel::ReplayOptions::Allocation::Pre;
    } else if (flags.is("--scale-bytes")) {
      o.scale_bytes = flags.int_value();
    } else if (flags.is("--iters")) {
      o.iterations = flags.int_value();
    } else if (flags.is("--no-overlap")) {
      o.overlap = false;
    } else if (flags.is_positional()) {
      inputs.push_back(flags.arg());
    } else {
      flags.unknown();
    }
  }
  MT_CHECK(!inputs.empty(), "mt_replay: give the traces (a folder of rank-<R>.json, or files)");
  std::vector<parallel::ExecutionTrace> traces;
  for (const std::string& f : trace_files(inputs))
    traces.push_back(parallel::read_execution_trace(f));
  std::shared_ptr<parallel::ProcessGroup> world = parallel::MpiProcessGroup::world();
  if (parallel::trace_ran_on_gpu(traces)) {
    const int gpus = runtime::cuda_device_count();
    MT_CHECK(gpus > 0, "mt_replay: the traces ran on GPUs (CUDA kernels or NCCL collectives) and "
             "this node has no usable CUDA device",
             parallel::nccl_available() ? "" : " (or this build has no NCCL)");
    // The launcher's local rank where it gives one (ranks placed round-robin over nodes), else
    // the world rank.
    runtime::set_current_device(
        runtime::Device::cuda(parallel::launcher_local_rank().value_or(world->rank()) % gpus));
    world = parallel::make_nccl_process_group(world);
  }
  const parallel::ReplayResult r = parallel::replay_step(*world, traces, o);
  if (world->rank() == 0) {
    std::cout << "replay of step " << traces.front().step << " on " << world->size()
              << " ranks, " << runtime::device_description(world->device())
              << " (rank 0's calls; allocation "
              << (o.allocation == parallel::ReplayOptions::Allocation::Lazy ? "lazy" : "pre")
              << ", scale-bytes " << o.scale_bytes << "):\n"
              << parallel::replay_table(r, world->size());
    if (o.compute) std::cout << "kernels (rank 0):\n" << parallel::replay_ops_table(r);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
