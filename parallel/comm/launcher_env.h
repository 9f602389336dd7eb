// What the launcher (mpirun, srun, torchrun-style) tells a process about its node through the
// environment: its index among the ranks of its node and their number, where it says.
#pragma once

#include <optional>

namespace mt::parallel {

// The local rank: Open MPI's, SLURM's, MPICH/Hydra's, MVAPICH's or LOCAL_RANK; nullopt when none.
std::optional<int> launcher_local_rank();
// The ranks on this node: Open MPI's, MPICH/Hydra's, MVAPICH's or LOCAL_WORLD_SIZE (SLURM gives
// the local id only); nullopt when none.
std::optional<int> launcher_local_size();

}  // namespace mt::parallel
