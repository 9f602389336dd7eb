// The collectives benchmark behind mt_comm_bench (nccl-tests / PARAM comms style): for sizes from
// min_bytes to max_bytes by step_factor, each collective is run warmup + iters times through a
// ProcessGroup; every timed iteration's result is checked against the values it must hold (unless
// check is off); the time per call is averaged over the iterations on each rank and reported as
// min / avg / max over the ranks, with algbw and busbw (parallel/comm/bandwidth.h) from the
// slowest rank's time, as nccl-tests does. An all_to_all with skew > 0 sends uneven blocks (rank
// r sends rank j about size/n x (1 + skew x ((r + 2j) mod n) / (n - 1)) bytes): its row reports
// the bottleneck rank's off-rank bytes and bandwidth instead of a busbw, which has no meaning
// there; all_to_all_weights replaces the skew with a distribution recorded in training. With
// compare_mpi (f32, an MPI group), the same sizes also go through the raw blocking MPI call on the
// group's communicator, alternating with ours call by call, for a side-by-side busbw.
//
// Sizes are nccl-tests' (bandwidth.h): rounded down to whole elements and to a multiple of the
// ranks where a collective splits its buffer. Collective over the group; rows come back on
// every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm/bandwidth.h"
#include "parallel/comm/process_group.h"

namespace mt::parallel {

struct CommBenchOptions {
  int64_t min_bytes = 8, max_bytes = 32ll << 20, step_factor = 2;
  std::vector<CollectiveKind> ops;  // empty: every kind
  runtime::DType dtype = runtime::DType::F32;  // f32 or bf16
  int64_t warmup = 5, iters = 20;
  bool check = true;
  double skew = 0;           // all_to_all: 0 = even blocks
  // all_to_all: a recorded distribution instead (weights[from][to], e.g. the bytes of a traced MoE
  // dispatch): rank r sends rank j size/n x n x weights[r][j] / (mean over ranks of their
  // weights' sum) bytes, so that the mean rank sends `size`. Empty: skew decides.
  std::vector<std::vector<double>> all_to_all_weights;
  bool compare_mpi = false;  // raw MPI side by side (f32 on an MPI group)
  // Where the buffers live: the group's device (a CUDA device for an NCCL group, whose calls are
  // then timed until the device has finished them).
  runtime::Device device = runtime::Device::cpu();
};

struct CommBenchRow {
  CollectiveKind kind = CollectiveKind::AllReduce;
  int64_t bytes = 0, count = 0;  // nccl-tests' size, and its element count
  double min_s = 0, avg_s = 0, max_s = 0;
  double algbw = 0, busbw = 0;   // bytes/s; busbw 0 for an uneven all_to_all
  bool checked = false;
  int64_t errors = 0;            // wrong elements seen over every rank and iteration
  // Uneven all_to_all only: the bottleneck rank, its off-rank bytes and bandwidth.
  bool uneven = false;
  int64_t bottleneck_rank = -1, bottleneck_bytes = 0;
  double bottleneck_bw = 0;
  // compare_mpi only: the raw MPI call's time (max over ranks) and busbw; 0 when not run.
  double mpi_max_s = 0, mpi_busbw = 0;
};

std::vector<CommBenchRow> run_comm_bench(ProcessGroup& group, const CommBenchOptions& options);

// The per-peer bytes of a traced uneven all_to_all on every rank, from a [comm] trace dump
// (<dump_folder>/comm/rank-R.jsonl, R < ranks): each rank's first uneven all_to_all named `name`
// ("" = any). Throws mt::Error naming what is missing or recorded on another number of ranks.
std::vector<std::vector<double>> all_to_all_weights_from_trace(const std::string& dump_folder,
                                                               const std::string& name,
                                                               int64_t ranks);

// nccl-tests-like text: a header line per collective, then size, count, type, time min/avg/max
// (us), algbw and busbw (GB/s), the check, and the raw MPI columns when measured.
std::string comm_bench_table(const std::vector<CommBenchRow>& rows, int64_t ranks,
                             runtime::DType dtype);

}  // namespace mt::parallel
