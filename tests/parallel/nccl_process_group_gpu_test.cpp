// NcclProcessGroup on one GPU. NCCL refuses two ranks on one device, so the group is the 1-rank
// world (MPI's local world as bootstrap): every collective's result is its input, checked for
// every dtype against the same call on the CPU backend; plus uneven all_to_all, split(), async
// ordering against the compute stream, stats, argument errors and the timeout (a compute stream
// held up by a host function keeps a collective from finishing); and FSDP with mixed precision
// and clipping on the device over the 1-rank NCCL mesh (what `train` runs on one GPU) against the
// same run on the CPU. Skips without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include "models/llama/model.h"
#include "models/llama/parallelize.h"
#include "models/parallel_context.h"
#include "parallel/clip_grad.h"
#include "parallel/comm/comm_bench.h"
#include "parallel/comm/mpi_process_group.h"
#include "parallel/comm/nccl_process_group.h"
#include "parallel/fsdp/fully_shard.h"
#include "parallel/mesh/device_mesh.h"
#include "runtime/core/device_runtime.h"
#include "runtime/core/rng.h"
#include "runtime/ops/elementwise.h"
#include "runtime/ops/factory.h"
#include "runtime/ops/loss.h"
#include "runtime/optim/adamw.h"
#include "tests/testing/errors.h"
#include "tests/testing/gpu.h"
#include "tests/testing/tensor_testing.h"

#if MT_HAVE_NCCL
#include <cuda_runtime.h>

#include "runtime/cuda/context.h"
#endif

namespace mt::parallel {
namespace {

using runtime::Device;
using runtime::DType;
using testing::error_of;

const std::vector<DType> kAllDtypes = {DType::F32,  DType::F64, DType::I32, DType::I64,
                                       DType::BF16, DType::F16, DType::Bool};

bool is_float(DType d) {
  return d == DType::F32 || d == DType::F64 || d == DType::BF16 || d == DType::F16;
}

// Random values of any dtype on the CPU (integers in [-50, 50), bools alternate at random).
Tensor random_cpu(const runtime::Shape& shape, DType dtype, uint64_t seed) {
  if (is_float(dtype)) return testing::randn_as(shape, dtype, seed, "nccl");
  Tensor u = runtime::rand(shape, runtime::RandomKey(seed, "nccl"), {DType::F64});
  std::vector<double> v = u.to_vector<double>();
  for (double& x : v) x = dtype == DType::Bool ? double(x < 0.5) : std::floor(x * 100.0 - 50.0);
  return runtime::from_vector(v, shape, {dtype});
}

Tensor cuda(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor zeros_cuda(const runtime::Shape& shape, DType dtype) {
  return runtime::zeros(shape,
                        runtime::TensorOptions{}.with_dtype(dtype).with_device(Device::cuda(0)));
}

// Equal values, same shape (exact: on one rank no collective changes a value).
void expect_same(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  Tensor g = gpu.to(Device::cpu());
  ASSERT_EQ(g.shape(), cpu.shape()) << what;
  EXPECT_EQ(g.to_vector<double>(), cpu.to_vector<double>()) << what;
}

std::shared_ptr<ProcessGroup> local_world() {
  return std::shared_ptr<ProcessGroup>(MpiProcessGroup::world());
}

TEST(NcclAvailability, FactoryExplainsWhyNot) {
  if (nccl_available()) GTEST_SKIP() << "NCCL and a GPU are available here";
  if (MpiProcessGroup::launched_by_launcher()) GTEST_SKIP() << "launched by mpirun/srun";
  const std::string e = error_of([] { make_nccl_process_group(local_world()); });
#if MT_HAVE_NCCL
  EXPECT_NE(e.find("no CUDA device"), std::string::npos) << e;
#else
  EXPECT_NE(e.find("this build has no NCCL"), std::string::npos) << e;
#endif
}

class NcclProcessGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!runtime::cuda_is_available()) GTEST_SKIP() << "no CUDA device";
    if (MpiProcessGroup::launched_by_launcher()) GTEST_SKIP() << "launched by mpirun/srun";
    runtime::set_current_device(Device::cuda(0));
    cpu = local_world();
    pg = make_nccl_process_group(cpu);
  }
  std::shared_ptr<ProcessGroup> cpu;  // the CPU backend: the reference, and the bootstrap
  std::unique_ptr<ProcessGroup> pg;
};

TEST_F(NcclProcessGroupTest, WorldOfOneRank) {
  EXPECT_TRUE(nccl_available());
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->name(), "nccl:mpi:world");
  EXPECT_EQ(pg->device_type(), runtime::DeviceType::CUDA);
}

TEST_F(NcclProcessGroupTest, EveryCollectiveEveryDtypeMatchesTheCpuBackend) {
  const runtime::Shape shape = {7, 13};  // no multiple of 32 or 128
  uint64_t seed = 1;
  for (DType d : kAllDtypes) {
    const std::string dt = detail::concat(d);
    Tensor ref = random_cpu(shape, d, seed++);
    if (d != DType::Bool) {
      std::vector<ReduceOp> ops = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};
      if (is_float(d)) ops.push_back(ReduceOp::Avg);
      for (ReduceOp op : ops) {
        Tensor t = cuda(ref), expected = ref.clone();
        pg->all_reduce(t, op, "ar");
        cpu->all_reduce(expected, op, "ar");
        expect_same(t, expected, "all_reduce " + dt + " " + reduce_op_name(op));
        Tensor rs = zeros_cuda(shape, d), rs_expected = runtime::zeros(shape, {d});
        pg->reduce_scatter_into(rs, cuda(ref), op, "rs");
        cpu->reduce_scatter_into(rs_expected, ref, op, "rs");
        expect_same(rs, rs_expected, "reduce_scatter_into " + dt + " " + reduce_op_name(op));
      }
    }
    Tensor ag = zeros_cuda(shape, d);
    pg->all_gather_into(ag, cuda(ref), "ag");
    expect_same(ag, ref, "all_gather_into " + dt);
    Tensor bc = cuda(ref);
    pg->broadcast(bc, 0, "bc");
    expect_same(bc, ref, "broadcast " + dt);
    Tensor a2a = zeros_cuda(shape, d);
    pg->all_to_all_single(a2a, cuda(ref), {7}, {7}, "a2a");
    expect_same(a2a, ref, "all_to_all_single " + dt);
    Tensor a2a_even = zeros_cuda(shape, d);
    pg->all_to_all_single(a2a_even, cuda(ref), {}, {}, "a2a");
    expect_same(a2a_even, ref, "all_to_all_single (even) " + dt);
  }
  pg->barrier("barrier");
  pg->barrier("barrier", /*async_op=*/true).wait();
}

// bf16/f16 reductions go through f32 buffers (the frontend's staging, on the NCCL stream) and
// back with round-to-nearest-even; on one rank that round trip must give the input bit for bit,
// as the CPU backend does, including for non-contiguous inputs and outputs.
TEST_F(NcclProcessGroupTest, SixteenBitReductionsStageThroughF32) {
  for (DType d : {DType::BF16, DType::F16}) {
    Tensor ref = random_cpu({33, 65}, d, 7);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      Tensor base = cuda(ref.t().contiguous());  // [65, 33]
      Tensor view = base.t();                    // [33, 65], non-contiguous
      Tensor expected = ref.clone();
      pg->all_reduce(view, op, "ar16");
      cpu->all_reduce(expected, op, "ar16");
      expect_same(view, expected, detail::concat("all_reduce ", d, " ", reduce_op_name(op)));
      Tensor out = zeros_cuda({65, 33}, d).t();  // non-contiguous output
      Tensor out_expected = runtime::zeros({33, 65}, {d});
      pg->reduce_scatter_into(out, view, op, "rs16");
      cpu->reduce_scatter_into(out_expected, expected, op, "rs16");
      expect_same(out, out_expected, detail::concat("reduce_scatter ", d, " ", reduce_op_name(op)));
    }
  }
}

TEST_F(NcclProcessGroupTest, NonContiguousAndEmptyTensors) {
  Tensor ref = random_cpu({6, 5}, DType::F32, 3);
  Tensor in = cuda(ref).t();                        // [5, 6] view
  Tensor out = zeros_cuda({8, 5}, DType::F32).t();  // [5, 8] view
  Tensor out_cols = out.narrow(1, 0, 6);            // [5, 6], non-contiguous
  pg->all_gather_into(out_cols, in, "ag", /*async_op=*/true).wait();
  expect_same(out_cols, ref.t(), "all_gather_into, views");
  Tensor a2a = zeros_cuda({8, 5}, DType::F32).t().narrow(1, 1, 6);
  pg->all_to_all_single(a2a, in, {5}, {5}, "a2a");
  expect_same(a2a, ref.t(), "all_to_all_single, views");

  for (DType d : {DType::F32, DType::BF16, DType::I64}) {
    Tensor empty = zeros_cuda({0, 4}, d);
    pg->all_reduce(empty, ReduceOp::Sum, "empty");
    pg->broadcast(empty, 0, "empty");
    pg->all_gather_into(zeros_cuda({0, 4}, d), empty, "empty");
    pg->reduce_scatter_into(zeros_cuda({0, 4}, d), empty, ReduceOp::Sum, "empty");
    pg->all_to_all_single(zeros_cuda({0, 4}, d), empty, {0}, {0}, "empty");
    EXPECT_EQ(empty.to(Device::cpu()).numel(), 0);
  }
}

TEST_F(NcclProcessGroupTest, AllToAllSplitsAndTheirErrors) {
  Tensor ref = random_cpu({5, 3, 2}, DType::BF16, 11);  // rows of 6 elements
  Tensor out = zeros_cuda({5, 3, 2}, DType::BF16);
  pg->all_to_all_single(out, cuda(ref), {5}, {5}, "a2a", /*async_op=*/true).wait();
  expect_same(out, ref, "all_to_all_single");
  // What rank 0 receives from itself (out_splits) differs from what it sends itself (in_splits).
  const std::string e = error_of([&] {
    pg->all_to_all_single(zeros_cuda({4, 3, 2}, DType::BF16), cuda(ref), {4}, {5}, "bad");
  });
  EXPECT_NE(e.find("all_to_all_single on group nccl:mpi:world"), std::string::npos) << e;
  EXPECT_NE(e.find("expected 24 elements from rank 0 (out_splits), which sends 30"),
            std::string::npos)
      << e;
  const std::string sum = error_of([&] { pg->all_to_all_single(out, cuda(ref), {4}, {5}, "bad"); });
  EXPECT_NE(sum.find("out_splits [4] sum to 4 rows"), std::string::npos) << sum;
}

TEST_F(NcclProcessGroupTest, SplitMakesAChildCommunicator) {
  auto sub = pg->split(3, 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->name(), "nccl:mpi:world/split(3,0)");
  auto subsub = sub->split(0, 5);
  EXPECT_EQ(subsub->name(), "nccl:mpi:world/split(3,0)/split(0,5)");
  // Members in world ranks, as traces name groups (mt_replay rebuilds them from these).
  EXPECT_EQ(pg->world_ranks(), std::vector<int>{0});
  EXPECT_EQ(subsub->world_ranks(), std::vector<int>{0});
  Tensor ref = random_cpu({9}, DType::F32, 5);
  Tensor t = cuda(ref);
  subsub->all_reduce(t, ReduceOp::Sum, "sub");
  pg->all_reduce(t, ReduceOp::Sum, "world");  // the parent still works
  expect_same(t, ref, "all_reduce on the split group");
#if MT_HAVE_NCCL
  // One NCCL stream per device for every group: two communicators' kernels never run at once.
  EXPECT_EQ(dynamic_cast<NcclProcessGroup&>(*subsub).stream(),
            dynamic_cast<NcclProcessGroup&>(*pg).stream());
#endif
  EXPECT_NE(error_of([&] { pg->split(-1, 0); }).find("color must be >= 0"), std::string::npos);
}

// Work on the compute stream before a call is seen by it; work after wait() sees its result;
// the host never had to wait. Large buffers make a missing dependency likely to show.
TEST_F(NcclProcessGroupTest, AsyncWorkIsOrderedAgainstTheComputeStream) {
  const int64_t n = int64_t(1) << 24;
  Tensor in = zeros_cuda({n}, DType::F32);
  Tensor out = zeros_cuda({n}, DType::F32);
  for (int k = 1; k <= 4; ++k) {
    in.fill_(double(k));  // queued on the compute stream
    Work w = pg->all_gather_into(out, in, "ag", /*async_op=*/true);
    w.wait();                   // the compute stream waits for the NCCL stream
    Tensor seen = out.clone();  // a kernel after wait()
    Tensor host = seen.to(Device::cpu());
    std::vector<float> v = host.to_vector<float>();
    int64_t wrong = 0;
    for (float x : v) wrong += x != float(k);
    EXPECT_EQ(wrong, 0) << "round " << k;
    EXPECT_TRUE(w.is_completed());
  }
  // Async calls, then a sync one: all ordered on the group's stream.
  Tensor t = cuda(random_cpu({1000}, DType::F32, 2));
  Tensor expected = t.to(Device::cpu());
  Work a = pg->all_reduce(t, ReduceOp::Avg, "ar", /*async_op=*/true);
  Work b = pg->broadcast(t, 0, "bc", /*async_op=*/true);
  Work c = pg->all_reduce(t, ReduceOp::Max, "ar");
  EXPECT_TRUE(c.is_completed());  // a sync call's Work is complete (stream-ordered)
  a.wait();
  b.wait();
  runtime::synchronize(Device::cuda(0));
  EXPECT_TRUE(a.is_completed());
  EXPECT_TRUE(b.is_completed());
  expect_same(t, expected, "async chain");
}

#if MT_HAVE_NCCL
// Asking whether a call has finished while it runs (Work::is_completed, a synchronous barrier's
// wait) must leave no error behind for the next kernel launch's check to report.
TEST_F(NcclProcessGroupTest, PollingAnUnfinishedCallLeavesNoErrorBehind) {
  Tensor t = zeros_cuda({4}, DType::F32);
  MT_CUDA_CHECK(cudaLaunchHostFunc(
      runtime::cuda::current_stream(),
      [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr));
  Work w = pg->all_reduce(t, ReduceOp::Sum, "held", /*async_op=*/true);
  EXPECT_FALSE(w.is_completed());  // the compute stream holds it back
  Tensor u = zeros_cuda({4}, DType::F32);
  u.fill_(2.0);  // a kernel launch, checked with cudaGetLastError
  w.wait();
  pg->barrier("barrier");  // the host polls until it has run
  u.fill_(3.0);
  expect_same(u, runtime::full({4}, 3.0, {DType::F32}), "kernel after polling");
  EXPECT_TRUE(w.is_completed());
}

// Traced calls are timed on the GPU: a call queued behind 300 ms of held compute starts on the
// device about 300 ms after the host issued it, and its record says so (device_timed); the host
// alone would have put its start at the issue.
TEST_F(NcclProcessGroupTest, TracedCallsCarryTheirDeviceTimes) {
  Tensor t = zeros_cuda({1 << 20}, DType::F32);
  CommTrace::start();
  // A first traced call takes the clock anchor (an event on an idle stream, waited for): taken
  // while the compute stream is held below, it could wait behind the hold where streams share a
  // hardware queue, and "after" would then be issued late.
  pg->all_reduce(t, ReduceOp::Sum, "prime");
  ASSERT_EQ(CommTrace::take().size(), 1u);
  MT_CUDA_CHECK(cudaLaunchHostFunc(
      runtime::cuda::current_stream(),
      [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }, nullptr));
  Work held = pg->all_reduce(t, ReduceOp::Sum, "held", /*async_op=*/true);
  Work after = pg->all_gather_into(zeros_cuda({1 << 20}, DType::F32), t, "after",
                                   /*async_op=*/true);
  held.wait();
  after.wait();
  const std::vector<CommRecord> records = CommTrace::take();
  CommTrace::stop();
  ASSERT_EQ(records.size(), 2u);
  for (const CommRecord& r : records) {
    EXPECT_TRUE(r.device_timed) << r.name;
    EXPECT_FALSE(r.device_times) << r.name;
    EXPECT_GE(r.end_us, r.start_us) << r.name;
    EXPECT_GT(r.start_us - r.issued_us, 250e3) << r.name << ": issued " << r.issued_us
                                               << ", started " << r.start_us;
    EXPECT_LT(r.start_us - r.issued_us, 5e6) << r.name;
  }
  EXPECT_GE(records[1].start_us, records[0].end_us) << "one stream: the gather after the reduce";
  const std::string line = comm_record_json(records[0], 1, 0);
  EXPECT_NE(line.find("\"device_timed\":true"), std::string::npos) << line;
  EXPECT_TRUE(parse_comm_trace_line(line, "line").collective.record.device_timed);
}
#endif

// The batch path (ncclGroupStart, the ops, ncclGroupEnd, the batch's event, its watchdog entry)
// on a one-GPU world: a batch of messages to this rank itself, traced and timed on the device.
TEST_F(NcclProcessGroupTest, ABatchOfMessagesToItselfArrives) {
  using Op = ProcessGroup::P2POp;
  using Kind = Op::Kind;
  const Tensor ref = random_cpu({1 << 20}, DType::F32, 9);
  const Tensor mine = cuda(ref);
  Tensor back = zeros_cuda({1 << 20}, DType::F32), back_bf16 = zeros_cuda({4099}, DType::BF16);
  CommTrace::start();
  const std::vector<Work> works = pg->batch_isend_irecv(
      {Op{Kind::Recv, back, 0, 5, "self.back"}, Op{Kind::Send, mine, 0, 5, "self.mine"},
       Op{Kind::Send, cuda(ref.narrow(0, 0, 4099).to(DType::BF16)), 0, 6, "self.bf16"},
       Op{Kind::Recv, back_bf16, 0, 6, "self.back_bf16"}});
  ASSERT_EQ(works.size(), 4u);
  for (const Work& w : works) w.wait();
  const std::vector<CommRecord> records = CommTrace::take();
  CommTrace::stop();
  expect_same(back, ref, "f32 message to itself");
  expect_same(back_bf16, ref.narrow(0, 0, 4099).to(DType::BF16), "bf16 message to itself");
  ASSERT_EQ(records.size(), 4u);
  for (const CommRecord& r : records) {
    EXPECT_EQ(r.batch, records.front().batch) << r.name;
    EXPECT_TRUE(r.device_timed) << r.name;
    EXPECT_GE(r.end_us, r.start_us) << r.name;
  }
  // A lone message to itself is refused before the group opens; the group still works after.
  EXPECT_THROW(pg->batch_isend_irecv({Op{Kind::Send, mine, 0, 7, "self.alone"}}), mt::Error);
  Tensor t = cuda(ref);
  pg->all_reduce(t, ReduceOp::Sum, "after");
  expect_same(t, ref, "all_reduce after the batches");
}

// The tiny llama of fsdp_mpi_test trained a few steps with FSDP over a 1-rank mesh of `group`
// (bf16 parameters, f32 reduction, two micro-batches, blocks resharded after forward), clipped on
// the device; returns the losses and norms per step.
struct FsdpTrace {
  std::vector<double> losses, norms;
  double held_step_seconds = -1;  // host time of the step run with the stream held
};

// shard_on_host: fully_shard the model as built (on the host) and move what is left afterwards,
// as train does; otherwise the whole model moves to `device` first.
// held_step: that step (forward, backward, clipping, optimizer) runs while the compute stream is
// held (testing::StreamBlocker, released after 3 s at the latest); its host time is recorded.
FsdpTrace train_tiny_llama(std::shared_ptr<ProcessGroup> group, Device device,
                           bool shard_on_host = false, int held_step = -1) {
  models::llama::ModelArgs a;
  a.dim = 32;
  a.n_layers = 3;
  a.n_heads = 4;
  a.n_kv_heads = 2;
  a.vocab_size = 61;
  a.multiple_of = 16;
  a.max_seq_len = 16;
  a.rope_theta = 10000.0;
  auto model = std::make_shared<models::llama::Transformer>(a, /*seed=*/3);
  if (!shard_on_host) model->to(device);
  models::ParallelContext ctx;
  ctx.dp_mesh = DeviceMesh::create(std::move(group), {1}, {"dp_shard"});
  ctx.reshard_after_forward = true;
  ctx.reshard_root_after_forward = false;
  ctx.mp_policy.param_dtype = DType::BF16;
  ctx.mp_policy.reduce_dtype = DType::F32;
  ctx.gradient_divide_factor = 1.0;
  models::llama::parallelize(*model, ctx);
  for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.device(), device) << name;
  model->to(device);  // the buffers
  runtime::optim::AdamW opt(model->named_parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  FsdpTrace trace;
  constexpr int64_t kBatch = 4, kSeq = 8;
  for (int step = 0; step < 6; ++step) {
    opt.zero_grad();
    Tensor u = runtime::rand({kBatch, kSeq + 1}, runtime::RandomKey(7, "nccl_fsdp", step % 2));
    Tensor tokens = runtime::mul(u, double(a.vocab_size) - 1e-6).to(DType::I64);
    Tensor loss_sum;
    std::optional<testing::StreamBlocker> hold;
    const auto start = std::chrono::steady_clock::now();
    if (step == held_step) hold.emplace(/*release_after_s=*/3.0);
    for (int m = 0; m < 2; ++m) {
      Tensor part = tokens.narrow(0, m * kBatch / 2, kBatch / 2);
      // Queued through pinned memory, as train's batches: the host does not wait.
      Tensor inputs = part.narrow(1, 0, kSeq).contiguous().to(device, /*non_blocking=*/true);
      Tensor labels = part.narrow(1, 1, kSeq).contiguous().to(device, /*non_blocking=*/true);
      Tensor loss = runtime::mul(
          runtime::cross_entropy((*model)(inputs), labels, -100, runtime::Reduction::Sum),
          1.0 / double(kBatch * kSeq));
      loss.backward();
      loss_sum = loss_sum.defined() ? runtime::add(loss_sum, loss.detach()) : loss.detach();
    }
    Tensor norm = clip_grad_norm_on_device_(distributed_parameters(*model), 0.5);
    EXPECT_EQ(norm.device(), device);
    opt.step();
    if (hold) {
      trace.held_step_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      hold.reset();  // released: the reads below wait for the step
    }
    trace.losses.push_back(loss_sum.item<double>());
    trace.norms.push_back(norm.item<double>());
  }
  return trace;
}

TEST_F(NcclProcessGroupTest, FsdpMixedPrecisionOnTheNcclMeshMatchesTheCpu) {
  std::shared_ptr<ProcessGroup> nccl = std::move(pg);
  const FsdpTrace gpu = train_tiny_llama(nccl, Device::cuda(0));
  const FsdpTrace ref = train_tiny_llama(cpu, Device::cpu());
  ASSERT_EQ(gpu.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    // bf16 compute on both, different kernels: agreement to bf16 precision.
    EXPECT_NEAR(gpu.losses[i], ref.losses[i], 2e-2 * std::abs(ref.losses[i])) << "step " << i;
    EXPECT_NEAR(gpu.norms[i], ref.norms[i], 5e-2 * std::abs(ref.norms[i])) << "step " << i;
  }
  EXPECT_LT(ref.losses[4], ref.losses[0]);  // it trains (steps 0, 2, 4 see the same batch)
  EXPECT_GT(ref.norms[0], 0.5);             // and clips
}

// No host wait in a training step: with the compute stream held, a step after the first
// (cuDNN graphs, blocks and NCCL connections made) only queues work, and returns well before
// the 3 s watchdog would release the stream; the reads of its loss and norm then wait.
TEST_F(NcclProcessGroupTest, FsdpTrainingStepDoesNotWaitForTheGpu) {
  const FsdpTrace trace = train_tiny_llama(std::move(pg), Device::cuda(0), false, /*held_step=*/2);
  EXPECT_GE(trace.held_step_seconds, 0);
  EXPECT_LT(trace.held_step_seconds, 1.5) << "the step waited for the GPU";
  for (double loss : trace.losses) EXPECT_TRUE(std::isfinite(loss));
}

// A model built on the host: FSDP moves each shard to the NCCL group's GPU. Same initial values,
// same kernels afterwards: the same run as the model moved whole first.
TEST_F(NcclProcessGroupTest, FsdpShardsAHostModelOntoTheGroupsGpu) {
  std::shared_ptr<ProcessGroup> nccl = std::move(pg);
  const FsdpTrace moved_first = train_tiny_llama(nccl, Device::cuda(0));
  const FsdpTrace sharded_on_host = train_tiny_llama(nccl, Device::cuda(0), true);
  EXPECT_EQ(sharded_on_host.losses, moved_first.losses);
  EXPECT_EQ(sharded_on_host.norms, moved_first.norms);
}

// mt_comm_bench --backend nccl's run: every collective (one rank: no send/recv ring) at a few
// sizes, buffers on the GPU, each timed call checked.
TEST_F(NcclProcessGroupTest, CommBenchChecksEveryCollectiveOnTheGpu) {
  CommBenchOptions o;
  o.min_bytes = 1024;
  o.max_bytes = 1 << 20;
  o.step_factor = 32;
  o.warmup = 1;
  o.iters = 3;
  o.device = Device::cuda(0);
  for (DType dtype : {DType::F32, DType::BF16}) {
    o.dtype = dtype;
    const std::vector<CommBenchRow> rows = run_comm_bench(*pg, o);
    EXPECT_EQ(rows.size(), 5u * 3u) << "5 collectives x 3 sizes";
    for (const CommBenchRow& r : rows) {
      EXPECT_TRUE(r.checked);
      EXPECT_EQ(r.errors, 0) << collective_kind_name(r.kind) << " " << r.bytes;
      EXPECT_GT(r.max_s, 0.0);
    }
  }
}

TEST_F(NcclProcessGroupTest, StatsCountCallsAndBytes) {
  Tensor t = zeros_cuda({4, 8}, DType::F32);
  pg->all_reduce(t, ReduceOp::Sum, "grad_sync");
  pg->all_reduce(t, ReduceOp::Sum, "grad_sync", /*async_op=*/true).wait();
  pg->all_gather_into(zeros_cuda({4, 8}, DType::BF16), zeros_cuda({4, 8}, DType::BF16), "params");
  auto s = pg->stats();
  EXPECT_EQ(s["grad_sync"].collective, "all_reduce");
  EXPECT_EQ(s["grad_sync"].calls, 2);
  EXPECT_EQ(s["grad_sync"].bytes, 2 * 4 * 8 * 4);
  EXPECT_EQ(s["params"].collective, "all_gather_into");
  EXPECT_EQ(s["params"].bytes, 4 * 8 * 2);
  const CollectiveRecord last = pg->last_collective();
  EXPECT_EQ(last.seq, 3);
  EXPECT_EQ(last.name, "params");
}

TEST_F(NcclProcessGroupTest, ArgumentErrorsNameTheCall) {
  const std::string host =
      error_of([&] { pg->all_reduce(runtime::zeros({3}, {DType::F32}), ReduceOp::Sum, "x"); });
  EXPECT_NE(host.find("all_reduce on group nccl:mpi:world (rank 0 of 1): tensor must be a cuda "
                      "tensor for this backend, got device cpu"),
            std::string::npos)
      << host;
  const std::string send = error_of([&] { pg->send(zeros_cuda({3}, DType::F32), 0, 0, "s"); });
  EXPECT_NE(send.find("dst must be another rank"), std::string::npos) << send;
  const std::string avg =
      error_of([&] { pg->all_reduce(zeros_cuda({3}, DType::I32), ReduceOp::Avg, "x"); });
  EXPECT_NE(avg.find("avg needs a floating dtype"), std::string::npos) << avg;
  const std::string rows = error_of([&] {
    pg->all_gather_into(zeros_cuda({3, 2}, DType::F32), zeros_cuda({2, 2}, DType::F32), "ag");
  });
  EXPECT_NE(rows.find("expected out to have 1 x the rows of in"), std::string::npos) << rows;
}

#if MT_HAVE_NCCL
// The compute stream is held up for 3 s by a host function; the collective waits for it, so it
// cannot finish within a 0.2 s timeout: the watchdog aborts the communicator and ends the process
// with the MPI backend's kind of report and exit code 124.
using NcclProcessGroupDeathTest = NcclProcessGroupTest;

TEST_F(NcclProcessGroupDeathTest, CallThatDoesNotFinishInTimeEndsTheJob) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(std::chrono::milliseconds(200));
        Tensor t = zeros_cuda({4}, DType::F32);
        MT_CUDA_CHECK(cudaLaunchHostFunc(
            runtime::cuda::current_stream(),
            [](void*) { std::this_thread::sleep_for(std::chrono::seconds(3)); }, nullptr));
        pg->all_reduce(t, ReduceOp::Sum, "stuck");
        std::this_thread::sleep_for(std::chrono::seconds(20));  // the watchdog ends us first
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(124),
      "collective timeout: all_reduce 'stuck' .call #1 on group nccl:mpi:world, rank 0 of 1. did "
      "not complete within 0.2 s");
}
#endif

}  // namespace
}  // namespace mt::parallel
