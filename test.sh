#!/usr/bin/env bash
# Run the whole test suite:   ./test.sh   (extra arguments go to pytest, e.g. ./test.sh -k ring -x)
#
# Creates/updates .venv on first use, then runs pytest. Multi-process tests start their own
# `mpiexec` ranks and TCP ranks with a timeout, so a hang fails a test instead of stalling.
# The CUDA kernels are tested under Numba's CUDA simulator in a separate process.
# With two cores or more the test files run on two pytest-xdist workers, whole files each
# (--dist loadfile: a file's fixtures, e.g. its SLURM cluster, stay in one process): many
# tests wait (for SLURM, a deadline, a peer) while the other worker computes. Pass -n 0 for one
# process (or -n N for N workers); -s, --pdb and --trace run in one process too.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/bootstrap_venv.sh
source "$here/scripts/bootstrap_venv.sh"
cd "$here"
case " $* " in  # the caller chose the workers, or asked for what needs one process
    *" -n "* | *" -n"[0-9]* | *" --numprocesses"* | *"no:xdist"* | *" -s "* | *" --capture=no "* \
        | *" --pdb"* | *" --trace "*)
        exec python -m pytest "$@" ;;
esac
# (nproc without OMP_NUM_THREADS, which bootstrap_venv.sh sets to 1 and nproc would obey)
if [ "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)" -ge 2 ]; then
    exec python -m pytest -n 2 --dist loadfile "$@"
fi
exec python -m pytest "$@"
