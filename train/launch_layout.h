// Where the ranks of a job run: each rank's node (SLURM's node name where slurmd started it, else
// the host name), the layout that follows (nodes, ranks per node) for the log and the embedding
// planner, the launcher's own description (a SLURM job and its restarts), and the training device
// each rank takes on its node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/device.h"

namespace mt::parallel {
class ProcessGroup;
}

namespace mt::train {

struct NodeLayout {
  std::vector<std::string> node_of_rank;  // by world rank
  std::vector<std::string> nodes;         // in the order of their first rank
  int64_t rank = 0;
  int64_t local_rank = 0;  // this rank's index among the ranks of its node
  int64_t local_size = 1;  // ranks on this rank's node
  // L when every node holds L ranks and node n holds ranks n*L .. n*L+L-1 (the block order of srun
  // and mpirun by default), which table_row_wise sharding needs; else 0 (and `irregular` says why).
  int64_t ranks_per_node = 0;
  std::string irregular;

  int64_t num_nodes() const { return int64_t(nodes.size()); }
  // "2 nodes, 2 ranks per node", "1 node, 4 ranks per node", or "3 nodes (<why irregular>)".
  std::string describe() const;
};

// This process's node: $SLURMD_NODENAME (set by slurmd, and distinct where several slurmd share a
// host) or the host name.
std::string node_name();

// The layout of `node_of_rank` (every rank's node) seen from `rank`.
NodeLayout node_layout_of(std::vector<std::string> node_of_rank, int64_t rank);

// Collective over `world`: every rank's node_name(), gathered.
NodeLayout gather_node_layout(parallel::ProcessGroup& world);

// The launcher, for the log: "SLURM job 123 (restart 1), 4 tasks" under SLURM, "" otherwise.
std::string launcher_text();

// The device [training] device names: "cpu", "cuda" (this process's GPU, made current), or
// "auto" (cuda when a GPU is usable). Errors name the key (`where`) when cuda is asked for and
// cannot be had. The GPU is the rank's local rank on its node (the launcher's local rank and
// size win where it gives them: containers on different nodes may share a host name).
runtime::Device resolve_training_device(const std::string& name, const std::string& where,
                                        parallel::ProcessGroup& world, const NodeLayout& layout);

// The GPU index of the rank `local_rank` of `local_size` ranks on `host` that sees `gpus` GPUs:
// its local rank, or 0 when the launcher gave each rank its own (one visible GPU and
// CUDA_VISIBLE_DEVICES set). More ranks than GPUs otherwise is an error naming the host and the
// counts (two ranks on one GPU would fail later inside NCCL).
int gpu_for_rank(int local_rank, int local_size, int gpus, bool visible_devices_set,
                 const std::string& host);

// Collective over `world`: the start-up lines of the log, one per node, from every rank's local
// rank, CPU threads and device:
//   node n1: ranks 0-1 (local 0-1), 2 threads each, cpu
std::string describe_placement(parallel::ProcessGroup& world, const NodeLayout& layout,
                               runtime::Device device);

// What both trainers set up first: the node layout, this rank's training device and the log's
// start-up lines (the launcher, then one line per node). Collective over `world`.
struct RankPlacement {
  NodeLayout nodes;
  runtime::Device device;
  std::string text;
};
RankPlacement place_ranks(parallel::ProcessGroup& world, const std::string& device_name,
                          const std::string& where);

}  // namespace mt::train
