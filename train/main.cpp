// train: trains a model from a TOML job config (see train/trainer.h for what a run does; for
// model.name = "dlrm", train/recsys_trainer.h).
//
//   train --config configs/fortunes_debug.toml [--section.key=value ...] [--print-config]
//   [--describe-model] [--print-pipeline-schedule] [--help]
//
// Exit status: 0 after training (also when stopped by Ctrl-C at the end of a step), 1 on an error
// (config, data, tokenizer: the message says what and where; with several ranks, an error on one
// ends them all), 2 on a bad command line.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "models/registry.h"
#include "parallel/comm/mpi_process_group.h"
#include "runtime/core/error.h"
#include "train/config/load.h"
#include "train/pipeline_setup.h"
#include "train/recsys_trainer.h"
#include "train/trainer.h"

namespace {

// "[rank 3] " under a launcher (every rank prints its own errors), "" for one process.
std::string rank_prefix() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::string("[rank ") + v + "] ";
  }
  return "";
}

// Two thread pools share the cores: OpenMP's (our kernels) and OpenBLAS's own (its pthreads build
// runs the GEMMs). Each spins its idle threads by default, and spinners take the cores the other
// pool's working threads need: OpenMP's after each parallel region (10-20% slower steps on a
// quiet 2-core machine, several times slower on a loaded one), OpenBLAS's for 2^28 cycles (about
// 0.1 s) after each GEMM (the kernels between GEMMs ran up to 2x slower: 15% a step of a ~20M
// model on 2 cores). Both libraries read their setting once, as the process loads them, so a
// `train` started without OMP_WAIT_POLICY or OPENBLAS_THREAD_TIMEOUT starts again, once, with
// PASSIVE and 16 (2^16 cycles, tens of microseconds); values the user set are kept. Where the
// re-exec fails (no /proc), it goes on with the libraries' defaults.
void restart_without_spinning_thread_pools(char** argv) {
  bool changed = false;
  for (const auto& [name, value] :
       {std::pair{"OMP_WAIT_POLICY", "PASSIVE"}, std::pair{"OPENBLAS_THREAD_TIMEOUT", "16"}}) {
    if (std::getenv(name) != nullptr) continue;
    if (setenv(name, value, 1) != 0) return;
    changed = true;
  }
  if (changed) execv("/proc/self/exe", argv);
}

// model.name is a language model of the registry or a recommendation model (dlrm): checked
// before either trainer starts, so that a typo is not taken for a language model that lacks a
// tokenizer.
void check_model_name(const mt::train::config::JobConfig& job) {
  const std::string& name = job.model.name;
  if (mt::train::is_recsys_model(name)) return;
  std::vector<std::string> names = mt::models::model_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  for (const std::string& n : mt::train::recsys_model_names()) names.push_back(n);
  std::string valid;
  for (const std::string& n : names) valid += (valid.empty() ? "" : ", ") + n;
  MT_FAIL("model.name = '", name, "' (", job.where("model.name"), ") is not a model; valid names: ",
          valid);
}

// Exit status 1 after an error's message: this rank's error may be its own (a path only it cannot
// read, a device it lacks), so the peers are ended too rather than left waiting for it.
int end_after_error() {
  mt::parallel::MpiProcessGroup::end_peers_after_error(1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  restart_without_spinning_thread_pools(argv);
  // Each log line reaches a redirected stdout (a job's log file) when it is printed, not when a
  // block fills: a run killed by its scheduler still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  namespace config = mt::train::config;
  config::CommandLine command_line;
  try {
    command_line = config::parse_command_line(argc, argv);
  } catch (const mt::Error& e) {
    std::cerr << "train: " << e.what() << "\n(see train --help)\n";
    return 2;
  }
  if (command_line.help) {
    std::cout << config::help_text("train");
    return 0;
  }
  try {
    const config::JobConfig job = config::load_config(command_line);
    check_model_name(job);
    if (command_line.print_config) {
      std::cout << config::render_toml(job);
      return 0;
    }
    if (command_line.describe_model) {
      std::cout << (mt::train::is_recsys_model(job.model.name)
                        ? mt::train::describe_recsys_model(job)
                        : mt::train::describe_model(job));
      return 0;
    }
    if (command_line.print_pipeline_schedule) {
      std::cout << mt::train::describe_pipeline_schedule(job);
      return 0;
    }
    if (mt::train::is_recsys_model(job.model.name)) {
      mt::train::RecsysTrainer trainer(job);
      trainer.train();
    } else {
      mt::train::Trainer trainer(job);
      trainer.train();
    }
  } catch (const mt::OutOfMemoryError& e) {
    std::cerr << (rank_prefix() + "error: " + e.what() +
                  "\n(the step's memory grows with training.local_batch_size and seq_len: lower "
                  "them, turn on activation checkpointing (activation_checkpoint.mode = \"full\"), "
                  "or shard over more ranks)\n")
              << std::flush;
    return end_after_error();
  } catch (const mt::Error& e) {
    // One write per message, so that the ranks' lines do not interleave.
    std::cerr << (rank_prefix() + "error: " + e.what() + "\n") << std::flush;
    return end_after_error();
  } catch (const std::exception& e) {
    std::cerr << (rank_prefix() + "unexpected error: " + e.what() + "\n") << std::flush;
    return end_after_error();
  }
  return 0;
}
