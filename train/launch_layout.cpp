// Node layout, launcher description and device placement of a job's ranks (see launch_layout.h).
#include "train/launch_layout.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "parallel/comm/launcher_env.h"
#include "parallel/comm/nccl_process_group.h"
#include "parallel/comm/object_collectives.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/error.h"

namespace mt::train {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// "0-3" for consecutive numbers, else "0,2,5".
std::string number_list(const std::vector<int64_t>& v) {
  if (v.empty()) return "";
  bool consecutive = true;
  for (size_t i = 1; i < v.size(); ++i) consecutive &= v[i] == v[i - 1] + 1;
  if (consecutive) {
    return v.size() == 1 ? std::to_string(v[0])
                         : std::to_string(v.front()) + "-" + std::to_string(v.back());
  }
  std::string out;
  for (int64_t x : v) {
    if (!out.empty()) out += ',';
    out += std::to_string(x);
  }
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

}  // namespace

std::string node_name() {
  if (const char* slurm = env("SLURMD_NODENAME")) return slurm;
  return host_name();
}

NodeLayout node_layout_of(std::vector<std::string> node_of_rank, int64_t rank) {
  NodeLayout l;
  l.node_of_rank = std::move(node_of_rank);
  l.rank = rank;
  std::map<std::string, std::vector<int64_t>> ranks_of;
  for (int64_t r = 0; r < int64_t(l.node_of_rank.size()); ++r) {
    const std::string& node = l.node_of_rank[size_t(r)];
    if (ranks_of[node].empty()) l.nodes.push_back(node);
    ranks_of[node].push_back(r);
  }
  const std::vector<int64_t>& mine = ranks_of[l.node_of_rank.at(size_t(rank))];
  l.local_size = int64_t(mine.size());
  l.local_rank = std::find(mine.begin(), mine.end(), rank) - mine.begin();
  const int64_t per_node = int64_t(ranks_of[l.nodes.front()].size());
  for (size_t n = 0; n < l.nodes.size() && l.irregular.empty(); ++n) {
    const std::vector<int64_t>& ranks = ranks_of[l.nodes[n]];
    if (int64_t(ranks.size()) != per_node) {
      l.irregular = "the nodes hold different numbers of ranks";
    } else if (ranks.front() != int64_t(n) * per_node || ranks.back() != ranks.front() + per_node - 1) {
      l.irregular = "the ranks of a node are not consecutive (a cyclic distribution)";
    }
  }
  if (l.irregular.empty()) l.ranks_per_node = per_node;
  return l;
}

std::string NodeLayout::describe() const {
  const std::string nodes_text =
      std::to_string(num_nodes()) + (num_nodes() == 1 ? " node" : " nodes");
  if (ranks_per_node == 0) return nodes_text + " (" + irregular + ")";
  return nodes_text + ", " + std::to_string(ranks_per_node) +
         (ranks_per_node == 1 ? " rank per node" : " ranks per node");
}

NodeLayout gather_node_layout(parallel::ProcessGroup& world) {
  const std::string mine = node_name();
  if (world.size() == 1) return node_layout_of({mine}, 0);
  return node_layout_of(parallel::all_gather_strings(world, mine, "train.nodes"), world.rank());
}

std::string launcher_text() {
  const char* job = env("SLURM_JOB_ID");
  if (job == nullptr) return "";
  std::string text = std::string("SLURM job ") + job;
  if (const char* restarts = env("SLURM_RESTART_COUNT"); restarts && std::atoi(restarts) > 0)
    text += std::string(" (requeued, restart ") + restarts + ")";
  if (const char* tasks = env("SLURM_STEP_NUM_TASKS")) text += std::string(", ") + tasks + " tasks";
  if (const char* nodes = env("SLURM_STEP_NODELIST")) text += std::string(" on ") + nodes;
  return text;
}

int gpu_for_rank(int local_rank, int local_size, int gpus, bool visible_devices_set,
                 const std::string& host) {
  MT_CHECK(gpus > 0, "train: no CUDA device on ", host);
  if (local_size <= gpus) return local_rank;  // one GPU per rank on the node
  // More ranks than GPUs visible: fine only when the launcher gave each rank its own GPU
  // (CUDA_VISIBLE_DEVICES per rank, so every rank sees one).
  MT_CHECK(gpus == 1 && visible_devices_set, "train: ", local_size, " ranks run on ", host,
           " but only ", gpus, " GPU(s) are visible to each; start at most ", gpus,
           " rank(s) per node (one per GPU), or give each rank its own GPU with "
           "CUDA_VISIBLE_DEVICES");
  return 0;
}

runtime::Device resolve_training_device(const std::string& name, const std::string& where,
                                        parallel::ProcessGroup& world, const NodeLayout& layout) {
  const int gpus = runtime::cuda_device_count();
  if (name == "cpu" || (name == "auto" && gpus == 0)) return runtime::Device::cpu();
  MT_CHECK(gpus > 0, "train: training.device = \"cuda\" (", where, ") but ",
           runtime::cuda_backend_built() ? "this machine has no usable CUDA device"
                                         : "this build has no CUDA backend (nvcc was not found)",
           "; use \"cpu\" or \"auto\"");
  MT_CHECK(world.size() == 1 || parallel::nccl_available(), "train: training on CUDA with ",
           world.size(), " ranks needs NCCL, which this build lacks; run one process, or ",
           "training.device = \"cpu\"");
  const int local_rank = parallel::launcher_local_rank().value_or(int(layout.local_rank));
  const int local_size = parallel::launcher_local_size().value_or(int(layout.local_size));
  const runtime::Device device = runtime::Device::cuda(
      gpu_for_rank(local_rank, local_size, gpus, env("CUDA_VISIBLE_DEVICES") != nullptr,
                   layout.node_of_rank.at(size_t(layout.rank))));
  runtime::set_current_device(device);
  return device;
}

std::string describe_placement(parallel::ProcessGroup& world, const NodeLayout& layout,
                               runtime::Device device) {
  // Per rank: "local rank|threads|device".
  const int local_rank = parallel::launcher_local_rank().value_or(int(layout.local_rank));
  const std::string mine = std::to_string(local_rank) + "|" +
                           std::to_string(omp_get_max_threads()) + "|" +
                           runtime::device_description(device);
  const std::vector<std::string> all =
      world.size() == 1 ? std::vector<std::string>{mine}
                        : parallel::all_gather_strings(world, mine, "train.placement");
  std::ostringstream os;
  for (const std::string& node : layout.nodes) {
    std::vector<int64_t> ranks, locals;
    std::vector<std::string> threads, devices;
    for (int64_t r = 0; r < int64_t(all.size()); ++r) {
      if (layout.node_of_rank[size_t(r)] != node) continue;
      const std::vector<std::string> f = split(all[size_t(r)], '|');
      ranks.push_back(r);
      locals.push_back(std::atoll(f.at(0).c_str()));
      if (std::find(threads.begin(), threads.end(), f.at(1)) == threads.end())
        threads.push_back(f.at(1));
      if (std::find(devices.begin(), devices.end(), f.at(2)) == devices.end())
        devices.push_back(f.at(2));
    }
    std::string threads_text, devices_text;
    for (const std::string& t : threads) threads_text += (threads_text.empty() ? "" : "/") + t;
    for (const std::string& d : devices) devices_text += (devices_text.empty() ? "" : ", ") + d;
    os << "node " << node << ": rank" << (ranks.size() == 1 ? " " : "s ") << number_list(ranks)
       << " (local " << number_list(locals) << "), " << threads_text
       << (threads_text == "1" ? " thread" : " threads") << (ranks.size() == 1 ? "" : " each")
       << ", " << devices_text << "\n";
  }
  return os.str();
}

RankPlacement place_ranks(parallel::ProcessGroup& world, const std::string& device_name,
                          const std::string& where) {
  RankPlacement p;
  p.nodes = gather_node_layout(world);
  p.device = resolve_training_device(device_name, where, world, p.nodes);
  const std::string launcher = launcher_text();
  p.text = (launcher.empty() ? "" : "launcher: " + launcher + "\n") +
           describe_placement(world, p.nodes, p.device);
  return p;
}

}  // namespace mt::train
