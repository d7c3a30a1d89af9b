#!/usr/bin/env bash
# Launch a minidist job on this machine:   ./mpirun.sh -n 4 python examples/train.py [args]
#
# - creates/updates the project's .venv on first use (mpi4py + the mpich wheel's mpiexec);
# - runs the venv's mpiexec (else the system's), one BLAS thread per rank;
# - adds what one machine needs: Open MPI gets --oversubscribe (more ranks than cores) and,
#   as root, --allow-run-as-root; MPICH/Hydra needs nothing extra;
# - MINIDIST_JOB_TIMEOUT_S=N (default: none) kills the whole job after N seconds.
# Everything after the mpiexec flags is the command each rank runs; `python` is the venv's.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/bootstrap_venv.sh
source "$here/scripts/bootstrap_venv.sh"

usage="usage: ./mpirun.sh -n N command [args...]   e.g. ./mpirun.sh -n 4 python examples/train.py"
if [ $# -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    echo "$usage"
    exit 0
fi
# A mistyped launch must not quietly train on one process: check -n N and the command's first
# word, in one line each. Other mpiexec options may come first; they are passed on as they are.
die() { echo "mpirun.sh: $1. $usage" >&2; exit 2; }
case "$1" in
    -n|-np)
        [ $# -ge 2 ] || die "$1 needs the number of ranks"
        { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ]; } ||
            die "$1 $2: the number of ranks must be a whole number >= 1"
        [ $# -ge 3 ] || die "no command after $1 $2"
        if [[ "$3" == *.py ]]; then
            die "'$3' is a Python file, not a command: put python before it (./mpirun.sh $1 $2 python $3)"
        fi
        ;;
    -*)
        has_n=0
        for a in "$@"; do [ "$a" = "-n" ] || [ "$a" = "-np" ] && has_n=1; done
        [ "$has_n" = 1 ] || die "no -n N: say how many ranks to start"
        ;;
    *)
        if [[ "$1" =~ ^[0-9]+$ ]]; then
            die "'$1' is not a command: give the number of ranks with -n (./mpirun.sh -n $1 ...)"
        fi
        die "no -n N before '$1': say how many ranks to start"
        ;;
esac

mpiexec_bin=$(command -v mpiexec || true)
if [ -z "$mpiexec_bin" ]; then
    echo "mpirun.sh: no mpiexec found; reinstall with: $minidist_venv/bin/pip install mpich" >&2
    exit 1
fi
extra=()
if "$mpiexec_bin" --version 2>&1 | grep -qi "open mpi\|open-mpi\|openrte"; then
    extra+=(--oversubscribe)
    [ "$(id -u)" = "0" ] && extra+=(--allow-run-as-root)
fi
# Export the thread pins to every rank explicitly (Hydra forwards the environment anyway).
cmd=("$mpiexec_bin" "${extra[@]}" "$@")
if [ -n "${MINIDIST_JOB_TIMEOUT_S:-}" ]; then
    if ! [[ "$MINIDIST_JOB_TIMEOUT_S" =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ "$MINIDIST_JOB_TIMEOUT_S" =~ ^0*([.]0*)?$ ]]; then
        echo "mpirun.sh: MINIDIST_JOB_TIMEOUT_S='$MINIDIST_JOB_TIMEOUT_S' is not valid: it accepts a positive number of seconds (default: no limit). Set such a value, or unset it." >&2
        exit 2
    fi
    exec timeout --kill-after=10 "$MINIDIST_JOB_TIMEOUT_S" "${cmd[@]}"
fi
exec "${cmd[@]}"
