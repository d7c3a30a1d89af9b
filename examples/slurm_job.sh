#!/usr/bin/env bash
# Run examples/train.py on a SLURM cluster, one task per rank, over MPI or over TCP.
#
#   sbatch examples/slurm_job.sh                 # MPI transport (mpi4py under srun)
#   sbatch examples/slurm_job.sh tcp             # TCP transport (torchrun-style variables)
#   sbatch --nodes=4 examples/slurm_job.sh tcp --epochs 10   # more nodes; train.py flags follow
#
# Submit from the repository root (the job cd's to $SLURM_SUBMIT_DIR). The venv is the one
# ./mpirun.sh creates; set MINIDIST_VENV to use another. See docs/launching.md, "SLURM".
#SBATCH --job-name=minidist-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=minidist-%j.out
set -euo pipefail

transport=${1:-mpi}
[ $# -gt 0 ] && shift
cd "${SLURM_SUBMIT_DIR:-.}"
python="${MINIDIST_VENV:-.venv}/bin/python"

# One BLAS thread per rank: the tasks of a node share its cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1

case "$transport" in
    mpi)
        # srun starts the ranks; mpi4py reads rank and size from SLURM's PMI. Clusters differ in
        # the PMI plugin (srun --mpi=list shows them): add --mpi=pmix or --mpi=pmi2 if needed.
        srun "$python" examples/train.py "$@"
        ;;
    tcp)
        # Rank 0 runs on the first node of the allocation; the port is derived from the job id,
        # so two jobs on one node do not collide. The token keeps strangers out of the job.
        MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
        MINIDIST_AUTH_TOKEN=$("$python" -c "import secrets; print(secrets.token_hex(16))")
        export MASTER_ADDR MASTER_PORT MINIDIST_AUTH_TOKEN
        # --mpi=none: no PMI variables, so each task is a torchrun-style rank over TCP. The
        # single quotes matter: each task expands its own SLURM_PROCID and SLURM_LOCALID.
        srun --mpi=none bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID \
            WORLD_SIZE=$SLURM_NTASKS exec "$0" examples/train.py "$@"' "$python" "$@"
        ;;
    *)
        echo "slurm_job.sh: unknown transport '$transport'; use 'mpi' or 'tcp'." >&2
        exit 2
        ;;
esac
