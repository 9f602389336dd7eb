// A program that misbehaves on purpose under mpirun, for comm_timeout_test: the last rank skips
// a collective (or dies) and the others must end with a report within the collective timeout.
//   comm_timeout_probe <scenario> <timeout_ms>
// Scenarios: skip (world all_reduce), skip_async (async all_reduce, waited), skip_split (on a
// split group), recv (a recv whose sender never sends), die (the last rank exits with code 3).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"

using namespace mt;
using parallel::ReduceOp;

namespace {

runtime::Tensor ones() { return runtime::ones({4}, {runtime::DType::F32}); }

[[noreturn]] void stall() {  // the misbehaving rank: alive, but never joins
  std::this_thread::sleep_for(std::chrono::minutes(5));
  std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: comm_timeout_probe <scenario> <timeout_ms>\n");
    return 2;
  }
  const std::string scenario = argv[1];
  parallel::set_collective_timeout(std::chrono::milliseconds(std::atoll(argv[2])));
  auto world = parallel::MpiProcessGroup::world();
  const bool culprit = world->rank() == world->size() - 1;
  world->all_reduce(ones(), ReduceOp::Sum, "probe.warmup");

  if (scenario == "skip") {
    if (culprit) stall();
    world->all_reduce(ones(), ReduceOp::Sum, "probe.skipped");
  } else if (scenario == "skip_async") {
    if (culprit) stall();
    world->all_reduce(ones(), ReduceOp::Sum, "probe.skipped", /*async_op=*/true).wait();
  } else if (scenario == "skip_split") {
    // Even ranks form one group, odd ranks another; the last rank is even when size is odd.
    auto group = world->split(world->rank() % 2, world->rank());
    group->barrier("probe.split_warmup");
    if (world->rank() % 2 == 1 || culprit) stall();
    group->all_reduce(ones(), ReduceOp::Sum, "probe.skipped");
  } else if (scenario == "recv") {
    if (world->rank() == 0) world->recv(ones(), 1, 7, "probe.recv");
    if (world->rank() != 0) stall();
  } else if (scenario == "die") {
    if (culprit) std::_Exit(3);
    world->all_reduce(ones(), ReduceOp::Sum, "probe.after_death");
  } else {
    std::fprintf(stderr, "comm_timeout_probe: unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  std::printf("probe: rank %d finished, which it should not\n", world->rank());
  return 0;
}
