// What the ProcessGroup frontend and its timeout-polled MPI calls cost over plain blocking MPI:
// an FSDP-sized all-gather (one debugmodel block, 3.3 MiB) and a 4-byte all-reduce (a loss
// scalar), each timed through MpiProcessGroup and through the blocking MPI call, in one run.
//   mpirun -np N build/bench/collective_overhead_bench
#include <mpi.h>

#include <chrono>
#include <cstdio>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"

using namespace mt;

namespace {

template <class Fn>
double microseconds_per_call(int calls, Fn&& fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         calls;
}

}  // namespace

int main() {
  auto world = parallel::MpiProcessGroup::world();
  if (!parallel::MpiProcessGroup::launched_by_launcher()) {
    std::fprintf(stderr, "run under mpirun (e.g. mpirun -np 2 %s)\n", "collective_overhead_bench");
    return 2;
  }
  const int n = world->size();
  const int per_rank = 3389 * 1024 / 4 / n;  // f32 elements: n ranks gather 3.3 MiB
  runtime::Tensor in = runtime::ones({per_rank}, {runtime::DType::F32});
  runtime::Tensor out = runtime::ones({int64_t(per_rank) * n}, {runtime::DType::F32});
  runtime::Tensor scalar = runtime::ones({1}, {runtime::DType::F32});
  for (int rep = 0; rep < 3; ++rep) {  // the first repetition warms up
    const double ag_ours = microseconds_per_call(50, [&] { world->all_gather_into(out, in, "ag"); });
    const double ag_mpi = microseconds_per_call(50, [&] {
      MPI_Allgather(in.data_ptr(), per_rank, MPI_FLOAT, out.data_ptr(), per_rank, MPI_FLOAT,
                    MPI_COMM_WORLD);
    });
    const double ar_ours = microseconds_per_call(
        1000, [&] { world->all_reduce(scalar, parallel::ReduceOp::Sum, "ar"); });
    const double ar_mpi = microseconds_per_call(1000, [&] {
      MPI_Allreduce(MPI_IN_PLACE, scalar.data_ptr(), 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    if (world->rank() == 0 && rep > 0) {
      std::printf("N=%d all_gather 3.3 MiB: ours %.0f us, MPI_Allgather %.0f us | all_reduce 4 B: "
                  "ours %.1f us, MPI_Allreduce %.1f us\n",
                  n, ag_ours, ag_mpi, ar_ours, ar_mpi);
    }
  }
  return 0;
}
