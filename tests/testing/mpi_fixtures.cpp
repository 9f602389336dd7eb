#include "tests/testing/mpi_fixtures.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <stdexcept>
#include <system_error>

#include "parallel/comm/mpi_process_group.h"
#include "runtime/ops/factory.h"
#include "tests/testing/trainer_fixtures.h"

namespace mt::testing {

namespace fs = std::filesystem;

std::shared_ptr<parallel::ProcessGroup> mpi_world() {
  static std::shared_ptr<parallel::ProcessGroup> world(parallel::MpiProcessGroup::world());
  return world;
}

namespace {

// The roots of the folders shared_dir made in this process. Removed by rank 0 after the last test
// once every rank is past it (a GoogleTest environment's TearDown: MPI still runs then), so that
// the tests leave nothing behind in the temporary folder.
class SharedDirRoots : public ::testing::Environment {
 public:
  static SharedDirRoots& get() {
    // GoogleTest owns the environment; registered on first use, torn down after the last test.
    static SharedDirRoots* roots = [] {
      auto* r = new SharedDirRoots;
      ::testing::AddGlobalTestEnvironment(r);
      return r;
    }();
    return *roots;
  }

  void add(const fs::path& root) { roots_.insert(root); }

  void TearDown() override {
    if (roots_.empty()) return;
    mpi_world()->barrier("shared_dir.remove");
    if (mpi_world()->rank() == 0) {
      for (const fs::path& root : roots_) {
        std::error_code ec;
        fs::remove_all(root, ec);
      }
    }
    roots_.clear();
  }

 private:
  std::set<fs::path> roots_;
};

}  // namespace

fs::path shared_dir(parallel::ProcessGroup& world, const std::string& prefix,
                    const std::string& name) {
  // Every rank of the launch registers the folder, so that all of them meet in the removal's
  // barrier after the last test.
  if (world.size() != mpi_world()->size()) {
    throw std::invalid_argument("shared_dir is collective over every rank of the launch (the "
                                "folders are removed after the last test, once all are done)");
  }
  runtime::Tensor pid =
      runtime::from_vector<int64_t>({int64_t(getpid())}, {1}, {runtime::DType::I64});
  world.broadcast(pid, 0, "pid");
  const fs::path root =
      fs::temp_directory_path() / (prefix + "_" + std::to_string(pid.item<int64_t>()));
  SharedDirRoots::get().add(root);
  const fs::path dir = root / name;
  // Every rank is done with the folder's previous use before rank 0 empties it (a loop that asks
  // for the same folder again must not pull it from under a sub-group still running).
  world.barrier("shared_dir.reuse");
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

void expect_resumes_on(
    parallel::ProcessGroup& world, int ranks, const train::TrainResult& straight,
    int64_t saved_step,
    const std::function<train::TrainResult(std::shared_ptr<parallel::ProcessGroup>)>& resume) {
  SCOPED_TRACE(::testing::Message() << "resumed on " << ranks << " ranks");
  const bool member = world.rank() < ranks;
  std::shared_ptr<parallel::ProcessGroup> sub =
      world.split(member ? 0 : 1, int(world.rank()));
  if (member) {
    const train::TrainResult r = resume(sub);
    const size_t steps = straight.losses.size() - size_t(saved_step);
    ASSERT_EQ(r.first_step, saved_step + 1);
    ASSERT_EQ(r.losses.size(), steps);
    for (size_t i = 0; i < steps; ++i) {
      const size_t s = size_t(saved_step) + i;
      EXPECT_NEAR(r.losses[i], straight.losses[s], 2e-5 * straight.losses[s]) << "step " << s + 1;
      EXPECT_NEAR(r.grad_norms[i], straight.grad_norms[s], 2e-5 * straight.grad_norms[s])
          << "step " << s + 1;
    }
  }
  world.barrier("expect_resumes_on.end");
}

}  // namespace mt::testing
