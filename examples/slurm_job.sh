#!/usr/bin/env bash
# Run examples/train.py on a SLURM cluster, one task per rank, over MPI or over TCP.
#
#   sbatch --nodes=2 examples/slurm_job.sh                # MPI: srun --mpi=pmi2 starts the ranks
#   sbatch --nodes=2 examples/slurm_job.sh tcp            # TCP: RANK=$SLURM_PROCID per task
#   sbatch --nodes=4 examples/slurm_job.sh tcp --epochs 10   # more nodes; train.py flags follow
#   sbatch --nodes=2 examples/slurm_job.sh --epochs 10       # MPI with train.py flags
#
# Submit from the repository root (the job cd's to $SLURM_SUBMIT_DIR). The venv is the one
# ./mpirun.sh creates; set MINIDIST_VENV to use another. MINIDIST_SRUN_MPI picks srun's PMI
# plugin (default pmi2, which the mpich wheel's PMI client speaks); MINIDIST_SRUN_MPI=mpiexec
# starts the ranks with the wheel's own mpiexec inside the allocation instead. The ranks per
# node: --ntasks-per-node below (at most the node's CPUs with --cpus-per-task=1).
# See docs/launching.md, "SLURM".
#SBATCH --job-name=minidist-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=minidist-%j.out
set -euo pipefail

transport=mpi   # the first argument when it is a transport; train.py's flags follow
case "${1:-}" in mpi|tcp) transport=$1; shift ;; -*|"") ;; *) transport=$1 ;; esac
cd "${SLURM_SUBMIT_DIR:-.}"
venv="${MINIDIST_VENV:-.venv}"
python="$venv/bin/python"

# One BLAS thread per rank: the tasks of a node share its cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1
echo "slurm_job.sh: job $SLURM_JOB_ID, $SLURM_NTASKS tasks on $SLURM_JOB_NUM_NODES nodes" \
     "($SLURM_JOB_NODELIST), transport $transport"

case "$transport" in
    mpi)
        # srun starts the ranks and serves them PMI: mpi4py (the mpich wheel) reads rank, size
        # and its peers' addresses from srun's pmi2 plugin. A site whose srun lacks it
        # (srun --mpi=list) gets the wheel's mpiexec, which starts one proxy per node with srun.
        plugin=${MINIDIST_SRUN_MPI:-pmi2}
        if [ "$plugin" != mpiexec ] && ! srun --mpi=list 2>&1 | grep -qw "$plugin"; then
            echo "slurm_job.sh: this srun has no '$plugin' PMI plugin (srun --mpi=list);" \
                 "starting the ranks with $venv/bin/mpiexec inside the allocation" >&2
            plugin=mpiexec
        fi
        if [ "$plugin" = mpiexec ]; then
            "$venv/bin/mpiexec" -launcher slurm -n "$SLURM_NTASKS" "$python" examples/train.py "$@"
        else
            srun --mpi="$plugin" "$python" examples/train.py "$@"
        fi
        ;;
    tcp)
        # Rank 0 runs on the first node of the allocation, where this script runs: a port free
        # there now is its rendezvous port. The token keeps strangers out of the job.
        MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        MASTER_PORT=$("$python" -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")
        MINIDIST_AUTH_TOKEN=$("$python" -c "import secrets; print(secrets.token_hex(16))")
        MINIDIST_RUN_ID="slurm-$SLURM_JOB_ID"   # the job's identity in the rendezvous
        export MASTER_ADDR MASTER_PORT MINIDIST_AUTH_TOKEN MINIDIST_RUN_ID
        echo "slurm_job.sh: rendezvous at $MASTER_ADDR:$MASTER_PORT"
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
