// Where the ranks of a job run (train/launch_layout.h): nodes and local ranks from every rank's
// node name, the regular layouts table_row_wise needs and the irregular ones it must not assume,
// SLURM's node name over the host name, the per-node start-up lines, and the GPU of a rank.
#include "train/launch_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"

namespace mt::train {
namespace {

using ::testing::HasSubstr;

TEST(LaunchLayout, BlocksOfEqualNodesHaveRanksPerNode) {
  const NodeLayout l = node_layout_of({"n1", "n1", "n2", "n2", "n3", "n3"}, 3);
  EXPECT_EQ(l.nodes, (std::vector<std::string>{"n1", "n2", "n3"}));
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 2);
  EXPECT_EQ(l.ranks_per_node, 2);
  EXPECT_EQ(l.describe(), "3 nodes, 2 ranks per node");
  EXPECT_EQ(node_layout_of({"a", "b", "c"}, 0).describe(), "3 nodes, 1 rank per node");
  EXPECT_EQ(node_layout_of({"a", "a", "a", "a"}, 2).describe(), "1 node, 4 ranks per node");
}

// table_row_wise assumes node n holds ranks n*L .. n*L+L-1: uneven nodes or a cyclic
// distribution have no ranks_per_node, and say why.
TEST(LaunchLayout, IrregularLayoutsHaveNoRanksPerNode) {
  const NodeLayout uneven = node_layout_of({"n1", "n1", "n2"}, 2);
  EXPECT_EQ(uneven.ranks_per_node, 0);
  EXPECT_EQ(uneven.local_rank, 0);
  EXPECT_EQ(uneven.local_size, 1);
  EXPECT_THAT(uneven.describe(), HasSubstr("different numbers of ranks"));
  const NodeLayout cyclic = node_layout_of({"n1", "n2", "n1", "n2"}, 2);
  EXPECT_EQ(cyclic.ranks_per_node, 0);
  EXPECT_EQ(cyclic.local_rank, 1);
  EXPECT_THAT(cyclic.describe(), HasSubstr("not consecutive"));
}

// Several slurmd may share a host (and containers a host name): SLURM's name of the node wins.
TEST(LaunchLayout, NodeNameIsSlurmsWhereSlurmStartedTheProcess) {
  const std::string host = node_name();
  EXPECT_FALSE(host.empty());
  setenv("SLURMD_NODENAME", "gpu-node-17", 1);
  EXPECT_EQ(node_name(), "gpu-node-17");
  unsetenv("SLURMD_NODENAME");
  EXPECT_EQ(node_name(), host);
}

TEST(LaunchLayout, LauncherTextNamesTheSlurmJobAndItsRestarts) {
  unsetenv("SLURM_JOB_ID");
  EXPECT_EQ(launcher_text(), "");
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_RESTART_COUNT", "1", 1);
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  setenv("SLURM_STEP_NODELIST", "n[1-2]", 1);
  EXPECT_EQ(launcher_text(), "SLURM job 4242 (requeued, restart 1), 4 tasks on n[1-2]");
  for (const char* v :
       {"SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST"})
    unsetenv(v);
}

TEST(LaunchLayout, OneProcessGetsOneStartUpLine) {
  if (parallel::MpiProcessGroup::launched_by_launcher()) GTEST_SKIP() << "launched by mpirun";
  unsetenv("SLURM_JOB_ID");  // no "launcher:" line
  const auto world = parallel::MpiProcessGroup::world();
  const RankPlacement p = place_ranks(*world, "cpu", "test");
  EXPECT_TRUE(p.device.is_cpu());
  EXPECT_EQ(p.nodes.num_nodes(), 1);
  const int threads = omp_get_max_threads();
  EXPECT_EQ(p.text, "node " + node_name() + ": rank 0 (local 0), " + std::to_string(threads) +
                        (threads == 1 ? " thread" : " threads") + ", cpu\n");
}

// Which GPU a rank takes: its local rank; one GPU per rank given by CUDA_VISIBLE_DEVICES; more
// ranks on a node than GPUs is an error naming the host and the counts.
TEST(LaunchLayout, GpuForRank) {
  EXPECT_EQ(gpu_for_rank(0, 1, 1, false, "h"), 0);
  EXPECT_EQ(gpu_for_rank(5, 8, 8, false, "h"), 5);
  EXPECT_EQ(gpu_for_rank(3, 4, 8, false, "h"), 3);
  EXPECT_EQ(gpu_for_rank(3, 8, 1, true, "h"), 0);  // each rank sees its own GPU
  try {
    gpu_for_rank(1, 2, 1, false, "node7");
    FAIL() << "expected mt::Error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("2 ranks run on node7"), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << m;
  }
  EXPECT_THROW(gpu_for_rank(2, 9, 8, true, "h"), Error);
}

}  // namespace
}  // namespace mt::train
