// Checkpoint save and load throughput, and how long an async save blocks training, on a
// Llama-like state (f32 tensors sharded Shard(0) over the ranks): a sync save (write + fsync +
// rename), the async save's blocking part (staging copies) and its total, a load into the same
// layout with every checksum verified, in one run; next to them the disk's own sequential write
// (+ fsync) and read bandwidth for the same bytes, each rank writing and reading its share of
// them as one raw file, so the checkpoint's throughput is shown as a fraction of the disk's.
//   [mpirun -np N] build/bench/checkpoint_bench [--mib 512] [--folder /tmp/mt_ckpt_bench]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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

// The disk's sequential bandwidth for `bytes`: one file written in 8 MiB writes and fsynced, then
// read back the same way (from the page cache where it fits, as the checkpoint load reads).
struct DiskBandwidth {
  double write_s = 0, read_s = 0;
};
DiskBandwidth measure_disk(const std::string& path, size_t bytes, parallel::ProcessGroup& world) {
  std::vector<char> block(size_t(8) << 20, 1);
  DiskBandwidth r;
  world.barrier("bench.disk_write");
  auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  MT_CHECK(fd >= 0, "cannot create ", path);
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(block.size(), bytes - done);
    MT_CHECK(::write(fd, block.data(), n) == ssize_t(n), "write failed: ", path);
    done += n;
  }
  MT_CHECK(::fsync(fd) == 0 && ::close(fd) == 0, "fsync failed: ", path);
  world.barrier("bench.disk_write_end");
  r.write_s = seconds_since(t0);
  t0 = Clock::now();
  const int rfd = ::open(path.c_str(), O_RDONLY);
  MT_CHECK(rfd >= 0, "cannot open ", path);
  while (::read(rfd, block.data(), block.size()) > 0) {
  }
  ::close(rfd);
  world.barrier("bench.disk_read_end");
  r.read_s = seconds_since(t0);
  fs::remove(path);
  return r;
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
  // A later save's blocking part: fresh staging buffers each time ("async") against the ones the
  // first save allocated ("async_with_pinned_mem": reuse_staging, page-locked on a GPU).
  t0 = Clock::now();
  async_mgr.save(3, state);
  const double fresh_again_s = seconds_since(t0);
  async_mgr.wait();
  checkpoint::CheckpointManager reuse_mgr({folder, 0, true, true}, world);
  reuse_mgr.save(4, state);
  reuse_mgr.wait();
  world->barrier("bench.reuse");
  t0 = Clock::now();
  reuse_mgr.save(5, state);
  const double reused_again_s = seconds_since(t0);
  reuse_mgr.wait();

  checkpoint::CheckpointState dest = make_state(mesh, mib);
  for (auto& p : dest.tensors) p.local.zero_();
  world->barrier("bench.load");
  t0 = Clock::now();
  checkpoint::load_checkpoint(fs::path(folder) / "step-1", dest, *world);
  const double load_s = seconds_since(t0);
  const bool ok = dest.tensors[5].local.numel() == 0 ||
                  dest.tensors[5].local.contiguous().data<float>()[0] == 5.0f;

  fs::create_directories(folder);
  const DiskBandwidth disk =
      measure_disk(folder + "/disk_probe_rank" + std::to_string(world->rank()),
                   size_t(mib) * (size_t(1) << 20) / size_t(world->size()), *world);

  if (world->rank() == 0) {
    std::printf(
        "| ranks | MiB | sync save s (MiB/s) | disk write+fsync MiB/s | save/disk | async blocking "
        "s "
        "| async total s | load s (MiB/s) | disk read MiB/s | load/disk | values |\n");
    std::printf(
        "| %d | %.0f | %.2f (%.0f) | %.0f | %.0f%% | %.3f | %.2f | %.2f (%.0f) | %.0f | %.0f%% | "
        "%s |\n",
        world->size(), total_mib, sync_s, total_mib / sync_s, total_mib / disk.write_s,
        100 * disk.write_s / sync_s, blocking_s, async_total_s, load_s, total_mib / load_s,
        total_mib / disk.read_s, 100 * disk.read_s / load_s, ok ? "ok" : "WRONG VALUES");
    std::printf("a later async save blocks: %.3f s with fresh staging buffers, %.3f s with the "
                "first save's (reuse_staging)\n",
                fresh_again_s, reused_again_s);
  }
  world->barrier("bench.end");
  if (world->rank() == 0) fs::remove_all(folder);
  return ok ? 0 : 1;
}
