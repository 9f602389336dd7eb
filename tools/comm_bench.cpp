// mt_comm_bench: a collectives benchmark in the manner of nccl-tests and PARAM comms, through
// minititan's process groups (parallel/comm/comm_bench.h). Run it under a launcher:
//
//   mpirun -np 4 build/tools/mt_comm_bench -b 8 -e 32M -f 2 [-o all_reduce|...|all] [-d f32|bf16]
//       [-w 5] [-n 20] [-c 1] [--skew 0.5 | --a2a-from DUMP [--a2a-name ep.dispatch]]
//       [--compare-mpi] [--backend mpi|nccl]
//
// -b/-e: smallest and largest size (bytes; K, M, G suffixes), -f: the factor between sizes,
// -o: the collective (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, sendrecv,
// isend_irecv (a ring of posted messages, one batch_isend_irecv), or all), -d: the dtype,
// -w/-n: warm-up and timed iterations, -c 0: skip the correctness check of every timed
// iteration, --skew S: an uneven all_to_all, --a2a-from DUMP: the all_to_all's distribution
// taken from a [comm] trace (each rank's first uneven all_to_all, or the first named
// --a2a-name), scaled to each size, --compare-mpi: the raw MPI call on the same sizes beside
// ours (f32), --backend nccl: an NCCL group over the GPUs (rank r on GPU r mod the node's GPU
// count; the buffers on the GPU; each call timed until the GPU has finished it; a build without
// CUDA, or a node without a GPU, says so). Rank 0 prints the table; exit status 1 when a check
// failed.
#include "parallel/comm/comm_bench.h"

#include <cstdio>
#include <iostream>
#include <memory>
#include <new>

#include "parallel/comm/launcher_env.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/nccl_process_group.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"
#include "tools/flags.h"

namespace {

using namespace mt;

// "64", "1K", "32M", "1G" -> bytes.
int64_t parse_bytes(const std::string& text) {
  MT_CHECK(!text.empty(), "mt_comm_bench: an empty size");
  int64_t scale = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K':
    case 'k':
      scale = 1ll << 10;
      digits.pop_back();
      break;
    case 'M':
    case 'm':
      scale = 1ll << 20;
      digits.pop_back();
      break;
    case 'G':
    case 'g':
      scale = 1ll << 30;
      digits.pop_back();
      break;
    default:
      break;
  }
  size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MT_CHECK(used == digits.size() && n > 0, "mt_comm_bench: '", text,
           "' is not a size (a positive integer, optionally with K, M or G)");
  return n * scale;
}

int run(int argc, char** argv) {
  parallel::CommBenchOptions o;
  std::string a2a_from, a2a_name, backend = "mpi";
  tools::FlagReader flags("mt_comm_bench", argc, argv);
  while (flags.next()) {
    if (flags.is("--help") || flags.is("-h")) {
      std::cout << "usage: mpirun -np N mt_comm_bench [-b MIN] [-e MAX] [-f FACTOR] [-o OP|all] "
                   "[-d f32|bf16] [-w WARMUP] [-n ITERS] [-c 0|1] "
                   "[--skew S | --a2a-from DUMP_FOLDER [--a2a-name NAME]] [--compare-mpi] "
                   "[--backend mpi|nccl]\n"
                   "(see the top of tools/comm_bench.cpp)\n";
      return 0;
    }
    if (flags.is("-b") || flags.is("--minbytes"))
      o.min_bytes = parse_bytes(flags.value());
    else if (flags.is("-e") || flags.is("--maxbytes"))
      o.max_bytes = parse_bytes(flags.value());
    else if (flags.is("-f") || flags.is("--stepfactor"))
      o.step_factor = flags.int_value();
    else if (flags.is("-o") || flags.is("--op")) {
      const std::string op = flags.value();
      if (op != "all") o.ops.push_back(parallel::collective_kind_from_name(op));
    } else if (flags.is("-d") || flags.is("--dtype")) {
      const std::string d = flags.value();
      MT_CHECK(d == "f32" || d == "bf16", "mt_comm_bench: -d must be f32 or bf16, got '", d, "'");
      o.dtype = d == "f32" ? runtime::DType::F32 : runtime::DType::BF16;
    } else if (flags.is("-w") || flags.is("--warmup_iters"))
      o.warmup = flags.int_value();
    else if (flags.is("-n") || flags.is("--iters"))
      o.iters = flags.int_value();
    else if (flags.is("-c") || flags.is("--check"))
      o.check = flags.int_value() != 0;
    else if (flags.is("--skew"))
      o.skew = flags.double_value();
    else if (flags.is("--a2a-from"))
      a2a_from = flags.value();
    else if (flags.is("--a2a-name"))
      a2a_name = flags.value();
    else if (flags.is("--compare-mpi"))
      o.compare_mpi = true;
    else if (flags.is("--backend"))
      backend = flags.value();
    else
      flags.unknown();
  }
  MT_CHECK(backend == "mpi" || backend == "nccl",
           "mt_comm_bench: --backend must be mpi or nccl, got '", backend, "'");
  MT_CHECK(backend == "mpi" || !o.compare_mpi,
           "mt_comm_bench: --compare-mpi compares with MPI's own calls: use it with --backend mpi");
  auto world = std::shared_ptr<parallel::ProcessGroup>(parallel::MpiProcessGroup::world());
  std::shared_ptr<parallel::ProcessGroup> group = world;
  if (backend == "nccl") {
    const int gpus = runtime::cuda_device_count();
    MT_CHECK(gpus > 0, "mt_comm_bench: --backend nccl needs a CUDA device; this node has none",
             parallel::nccl_available() ? "" : " (and this build has no NCCL)");
    // The launcher's local rank where it gives one (ranks placed round-robin over nodes), else
    // the world rank.
    const int local_rank = parallel::launcher_local_rank().value_or(world->rank());
    o.device = runtime::Device::cuda(local_rank % gpus);
    runtime::set_current_device(o.device);
    group = parallel::make_nccl_process_group(world);
  }
  if (!a2a_from.empty()) {
    o.all_to_all_weights =
        parallel::all_to_all_weights_from_trace(a2a_from, a2a_name, world->size());
  }
  const std::vector<parallel::CommBenchRow> rows = parallel::run_comm_bench(*group, o);
  if (world->rank() == 0) std::cout << parallel::comm_bench_table(rows, world->size(), o.dtype);
  for (const auto& r : rows)
    if (r.errors > 0) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: mt_comm_bench: out of memory: each rank holds several buffers "
                         "of the largest size (-e) and their host copies; give a smaller -e\n");
    return 2;
  }
}
