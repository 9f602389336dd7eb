#include "parallel/comm/launcher_env.h"

#include <cstdlib>
#include <initializer_list>

namespace mt::parallel {

namespace {

std::optional<int> first_set(std::initializer_list<const char*> vars) {
  for (const char* var : vars) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> launcher_local_rank() {
  return first_set({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                    "MV2_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"});
}

std::optional<int> launcher_local_size() {
  return first_set({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "LOCAL_WORLD_SIZE"});
}

}  // namespace mt::parallel
