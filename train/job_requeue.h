// Requeueing a preempted SLURM job ([job] requeue_on_preemption): after a SIGUSR1 stop has saved
// its checkpoint, rank 0 runs `scontrol requeue $SLURM_JOB_ID` (SLURM then ends the job's
// processes and queues the same job again; its batch script starts from the top and `train`
// resumes from the latest checkpoint of its dump folder). Says in `log` what it did, or why not:
// not under SLURM (no SLURM_JOB_ID), or scontrol failing (missing, the job not requeueable); a
// failed requeue is a warning, the checkpoint is saved either way.
#pragma once

#include <ostream>

namespace mt::train {

void requeue_job(std::ostream& log);

}  // namespace mt::train
