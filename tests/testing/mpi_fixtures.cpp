#include "tests/testing/mpi_fixtures.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "runtime/ops/factory.h"
#include "tests/testing/trainer_fixtures.h"

namespace mt::testing {

namespace fs = std::filesystem;

fs::path shared_dir(parallel::ProcessGroup& world, const std::string& prefix,
                    const std::string& name) {
  runtime::Tensor pid =
      runtime::from_vector<int64_t>({int64_t(getpid())}, {1}, {runtime::DType::I64});
  world.broadcast(pid, 0, "pid");
  const fs::path dir =
      fs::temp_directory_path() / (prefix + "_" + std::to_string(pid.item<int64_t>()) + "_" + name);
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier("shared_dir");
  return dir;
}

fs::path shared_small_tokenizer(parallel::ProcessGroup& world, const std::string& prefix,
                                const fs::path& corpus) {
  const fs::path dir = shared_dir(world, prefix, "tokenizer");
  if (world.rank() == 0) save_small_tokenizer(corpus, dir);
  world.barrier("tokenizer");
  return dir;
}

void guarded(int64_t rank, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << rank << ": " << e.what();
  }
}

}  // namespace mt::testing
