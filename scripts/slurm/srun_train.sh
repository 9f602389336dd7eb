#!/usr/bin/env bash
# Runs `train` on every task of the SLURM job that calls it (the batch scripts beside this file
# exec it; see docs/slurm.md): srun --mpi=pmix, the CPU threads from the job's
# --cpus-per-task, the requeue on a preemption warning, and the command line logged.
#   srun_train.sh --config configs/X.toml [--section.key=value ...]
# Environment (set by the batch scripts' top block):
#   MT_TRAIN              the train binary (default: $MT_ROOT/build/train/train)
#   MT_ROOT               the minititan checkout (default: the submit directory)
#   DUMP_FOLDER           job.dump_folder, on a file system every node sees ("" = the config's)
#   REQUEUE_ON_PREEMPTION true: SIGUSR1 (#SBATCH --signal=USR1@SECONDS) saves and requeues
set -euo pipefail
if [ -z "${SLURM_JOB_ID:-}" ]; then
  echo "srun_train.sh: not inside a SLURM job (no SLURM_JOB_ID); submit a batch script with sbatch" >&2
  exit 2
fi
root=${MT_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
train=${MT_TRAIN:-$root/build/train/train}
if [ ! -x "$train" ]; then
  echo "srun_train.sh: no train binary at $train (build it: cmake --build build, or set MT_TRAIN)" >&2
  exit 2
fi
cd "${SLURM_SUBMIT_DIR:-$PWD}"  # relative paths of the config are the submitter's

# One OpenMP (and OpenBLAS) thread per CPU given to each task, never more than the task owns.
threads=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}

args=("$@")
if [ -n "${DUMP_FOLDER:-}" ]; then args+=("--job.dump_folder=$DUMP_FOLDER"); fi
if [ "${REQUEUE_ON_PREEMPTION:-false}" = true ]; then
  # A requeued job starts this script again and resumes from the checkpoint of its stop.
  args+=("--checkpoint.enable=true" "--job.requeue_on_preemption=true")
fi

echo "srun_train.sh: job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on" \
  "${SLURM_JOB_NUM_NODES:-1} node(s), ${SLURM_NTASKS:-1} task(s), $OMP_NUM_THREADS thread(s) each:" \
  "$train ${args[*]}"
# --mpi=pmix: the tasks find each other through PMIx (OpenMPI); `srun --mpi=list` shows what the
# site has. --kill-on-bad-exit: one task that dies ends the others at once.
exec srun --mpi=pmix --kill-on-bad-exit=1 "$train" "${args[@]}"
