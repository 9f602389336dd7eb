// Requeueing a preempted SLURM job (see job_requeue.h).
#include "train/job_requeue.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

extern char** environ;

namespace mt::train {

namespace {

// `program args...` from PATH without a shell; its exit status, or -1 when it could not start.
int run_program(const char* program, std::initializer_list<std::string> args, std::string& error) {
  std::vector<std::string> storage{program};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program, nullptr, nullptr, argv.data(), environ);
  if (rc != 0) {
    error = std::strerror(rc);
    return -1;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      error = std::strerror(errno);
      return -1;
    }
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

void requeue_job(std::ostream& log) {
  const char* job = std::getenv("SLURM_JOB_ID");
  if (job == nullptr || *job == '\0') {
    log << "warning: job.requeue_on_preemption: not under SLURM (no SLURM_JOB_ID), so not "
           "requeued; start the job again to resume from its checkpoint\n"
        << std::flush;
    return;
  }
  const std::string id(job);
  std::string error;
  const int status = run_program("scontrol", {"requeue", id}, error);
  if (status == 0) {
    log << "job: requeued SLURM job " << id << " (scontrol requeue " << id
        << "); it resumes from this checkpoint when it starts again\n"
        << std::flush;
  } else {
    log << "warning: scontrol requeue " << id << " "
        << (status < 0 ? "could not run: " + error
                       : "failed with exit status " + std::to_string(status))
        << ", so the job is not requeued (is it submitted with --requeue, and scontrol on PATH?); "
           "submit it again to resume from its checkpoint\n"
        << std::flush;
  }
}

}  // namespace mt::train
