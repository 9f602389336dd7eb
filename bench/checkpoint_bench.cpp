// Checkpoint save and load throughput, and how long an async save blocks training, on a
// Llama-like state (f32 tensors sharded Shard(0) over the ranks): a sync save (write + fsync +
// rename), the async save's blocking part (staging copies) and its total, a load into the same
// layout with every checksum verified, in one run.
//   [mpirun -np N] build/bench/checkpoint_bench [--mib 512] [--folder /tmp/mt_ckpt_bench]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "checkpoint/distributed_checkpoint.h"
#include "checkpoint/manager.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/mesh/device_mesh.h"
#include "parallel/mesh/dtensor.h"
#include "runtime/ops/factory.h"

using namespace mt;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 24 matrices of [rows, 1024] f32 totalling about `mib` MiB, each rank holding its Shard(0) rows.
checkpoint::CheckpointState make_state(const std::shared_ptr<parallel::DeviceMesh>& mesh,
                                       int64_t mib) {
  checkpoint::CheckpointState s;
  const int64_t rows = mib * (int64_t(1) << 20) / 4 / 1024 / 24;
  for (int i = 0; i < 24; ++i) {
    const runtime::Shape shape{rows, 1024};
    const parallel::LocalPiece piece = parallel::local_piece(shape, *mesh, {parallel::Shard{0}});
    runtime::Tensor local = runtime::full(piece.shape, double(i), {runtime::DType::F32});
    s.tensors.push_back({"model.t" + std::to_string(i), local, shape, piece.offset});
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t mib = 512;
  std::string folder = "/tmp/mt_ckpt_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mib") == 0) mib = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--folder") == 0) folder = argv[i + 1];
  }
  std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  auto mesh = parallel::DeviceMesh::create(world, {world->size()}, {"dp"});
  if (world->rank() == 0) fs::remove_all(folder);
  world->barrier("bench.start");
  checkpoint::CheckpointState state = make_state(mesh, mib);
  const double total_mib = double(mib);

  auto t0 = Clock::now();
  checkpoint::save_checkpoint(fs::path(folder) / "step-1", state, *world);
  const double sync_s = seconds_since(t0);

  checkpoint::CheckpointManager async_mgr({folder, 0, true}, world);
  world->barrier("bench.async");
  t0 = Clock::now();
  async_mgr.save(2, state);
  const double blocking_s = seconds_since(t0);
  async_mgr.wait();
  const double async_total_s = seconds_since(t0);

  checkpoint::CheckpointState dest = make_state(mesh, mib);
  for (auto& p : dest.tensors) p.local.zero_();
  world->barrier("bench.load");
  t0 = Clock::now();
  checkpoint::load_checkpoint(fs::path(folder) / "step-1", dest, *world);
  const double load_s = seconds_since(t0);
  const bool ok = dest.tensors[5].local.numel() == 0 ||
                  dest.tensors[5].local.contiguous().data<float>()[0] == 5.0f;

  if (world->rank() == 0) {
    std::printf("| %d | %.0f | %.2f (%.0f MiB/s) | %.3f | %.2f | %.2f (%.0f MiB/s) | %s |\n",
                world->size(), total_mib, sync_s, total_mib / sync_s, blocking_s, async_total_s,
                load_s, total_mib / load_s, ok ? "ok" : "WRONG VALUES");
  }
  world->barrier("bench.end");
  if (world->rank() == 0) fs::remove_all(folder);
  return ok ? 0 : 1;
}
