#!/usr/bin/env bash
# Launch a minidist job on this machine:   ./mpirun.sh -n 4 python examples/train.py [args]
#
# - creates/updates the project's .venv on first use (mpi4py + the mpich wheel's mpiexec);
# - runs the venv's mpiexec (else the system's), one BLAS thread per rank;
# - adds what one machine needs: Open MPI gets --oversubscribe (more ranks than cores) and,
#   as root, --allow-run-as-root; MPICH/Hydra needs nothing extra;
# - MINIDIST_JOB_TIMEOUT_S=N (default: none) kills the whole job after N seconds;
# - the job dies with this script, even with kill -9 (a watchdog outside it ends the job), and
#   a rank killed from outside is named by its rank and PID in one line at the end.
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
    cmd=(timeout --kill-after=10 "$MINIDIST_JOB_TIMEOUT_S" "${cmd[@]}")
fi

# MPICH's shared-memory files (/dev/shm/mpich_shm_*) are removed by MPI_Finalize, and by the
# ranks themselves before an MPI_Abort; a rank killed from outside (SIGTERM, SIGKILL, the job
# timeout) leaves its node's file behind. Those of this job that no live process maps any more
# are removed at the end, with one line saying so.
shm_files() { (cd /dev/shm 2>/dev/null && ls -1 2>/dev/null | grep '^mpich_shm_' | sort) || true; }
shm_before=$(shm_files)
remove_leftovers() {
    local f n=0 young=0 now
    now=$(date +%s)
    for f in $(comm -13 <(printf '%s\n' "$shm_before") <(shm_files)); do
        grep -qsF "/dev/shm/$f" /proc/[0-9]*/maps && continue  # another job's, still in use
        # a file younger than 5 s may be another job's that its ranks are about to map, unless
        # the watchdog saw this job's ranks map it, or no other MPI job runs here
        if ! grep -qsxF "shm $f" "$ranks_file" && pgrep -x hydra_pmi_proxy >/dev/null 2>&1 &&
                [ $((now - $(stat -c %Y "/dev/shm/$f" 2>/dev/null || echo "$now"))) -lt 5 ]; then
            young=$((young + 1))
            continue
        fi
        rm -f "/dev/shm/$f" && n=$((n + 1))
    done
    if [ "$n" -gt 0 ]; then
        echo "mpirun.sh: removed $n MPICH shared-memory file(s) (/dev/shm/mpich_shm_*) that the job's killed ranks left behind." >&2
    fi
    if [ "$young" -gt 0 ]; then
        echo "mpirun.sh: $young new MPICH shared-memory file(s) (/dev/shm/mpich_shm_*) may be left by killed ranks; remove them with rm /dev/shm/mpich_shm_* when no MPI job runs." >&2
    fi
}

# The watchdog, a process of its own, looks every 0.5 s whether this script still runs; when
# it is gone (kill -9 cannot be trapped) it sends SIGTERM to the job (mpiexec ends its ranks;
# timeout passes it on), and SIGKILL after 5 s to whatever of the job is left. Until every rank
# has started (20 s at most) it also notes each rank's PID (the ranks carry
# MPIRUN_SH_JOB=<this script's PID>; Hydra sets PMI_RANK) and the shared-memory files they map.
# A copy of mpiexec's output goes through grep, which keeps MPICH's banner line naming the PID
# of a rank that ended the job (=   PID 25927 RUNNING AT host), so it is named by its rank.
ranks_file=$(mktemp "${TMPDIR:-/tmp}/mpirun.sh.ranks.XXXXXX")
nranks=0
if [ "$1" = -n ] || [ "$1" = -np ]; then nranks=$2; fi
watchdog() {
    local script=$1 job=$2 e pid rank f known=" " count=0 polls=0
    set +e  # a process that ends while it is looked at is normal here
    trap '' INT
    while kill -0 "$script" 2>/dev/null; do
        kill -0 "$job" 2>/dev/null || return 0
        if [ "$polls" -lt 40 ]; then  # the first 20 s, until every rank maps its files
            polls=$((polls + 1))
            for e in $(grep -lsF "MPIRUN_SH_JOB=$script" /proc/[0-9]*/environ); do
                pid=${e#/proc/}; pid=${pid%/environ}
                rank=$(tr '\0' '\n' 2>/dev/null < "$e" | sed -n 's/^PMI_RANK=//p')
                [ -n "$rank" ] || continue
                if [[ "$known" != *" $pid "* ]]; then
                    known+="$pid "
                    echo "rank $pid $rank" >> "$ranks_file"
                fi
                for f in $(grep -os '/dev/shm/mpich_shm_[^ ]*' "/proc/$pid/maps" | sort -u); do
                    if ! grep -qsxF "shm ${f#/dev/shm/}" "$ranks_file"; then
                        echo "shm ${f#/dev/shm/}" >> "$ranks_file"
                        count=$((count + 1))
                    fi
                done
            done
            [ "$nranks" -gt 0 ] && [ "$count" -ge 1 ] && \
                [ "$(grep -c '^rank ' "$ranks_file")" -ge "$nranks" ] && polls=40
        fi
        sleep 0.5
    done
    kill -TERM "$job" 2>/dev/null
    for _ in $(seq 25); do kill -0 "$job" 2>/dev/null || break; sleep 0.2; done
    for e in $(grep -lsF "MPIRUN_SH_JOB=$script" /proc/[0-9]*/environ); do
        pid=${e#/proc/}; kill -KILL "${pid%/environ}" 2>/dev/null
    done
    kill -KILL "$job" 2>/dev/null
    sleep 0.2
    for f in $(sed -n 's/^shm //p' "$ranks_file"); do  # the killed ranks' files, now unused
        grep -qsF "/dev/shm/$f" /proc/[0-9]*/maps || rm -f "/dev/shm/$f"
    done
    rm -f "$ranks_file"
    echo "mpirun.sh (PID $script) was killed: stopped every rank of its job and removed its MPICH shared-memory files." >&2
}

# The job runs in the background so that a SIGTERM to this script reaches it at once; a
# terminal's Ctrl-C reaches mpiexec directly (same process group), which forwards it to the ranks.
got=""
trap 'got=TERM; kill -TERM "$job" 2>/dev/null || true' TERM  # (the job may be gone: set -e)
trap 'got=INT' INT
MPIRUN_SH_JOB=$$ "${cmd[@]}" > >(tee >(grep -a --line-buffered -o 'PID [0-9]* RUNNING AT' \
    >> "$ranks_file")) &
job=$!
watchdog "$$" "$job" < /dev/null > /dev/null &
guard=$!
while :; do
    wait "$job" && rc=0 || rc=$?
    kill -0 "$job" 2>/dev/null || break  # wait returned for a trapped signal: the job runs on
done
trap - TERM INT
kill "$guard" 2>/dev/null || true
wait "$guard" 2>/dev/null || true
if [ "$rc" -ne 0 ]; then
    sleep 0.2  # grep's copy of mpiexec's last lines
    bad=$(sed -n 's/^PID \([0-9]*\) RUNNING AT$/\1/p' "$ranks_file" | head -1)
    who=$(sed -n "s/^rank $bad //p" "$ranks_file" | head -1)
    if [ -n "$bad" ] && [ -n "$who" ] && [ "$got" != TERM ]; then
        echo "mpirun.sh: rank $who (PID $bad) ended the job: it is the process MPICH's banner above names (EXIT CODE 9: killed by SIGKILL, 15: by SIGTERM)." >&2
    fi
    remove_leftovers
fi
rm -f "$ranks_file"
if [ "$got" = TERM ]; then
    echo "mpirun.sh: received SIGTERM: stopped every rank of the job (exit code 143)." >&2
    exit 143
fi
if [ "$rc" -eq 124 ] && [ -n "${MINIDIST_JOB_TIMEOUT_S:-}" ]; then
    echo "mpirun.sh: the job ran longer than MINIDIST_JOB_TIMEOUT_S=$MINIDIST_JOB_TIMEOUT_S s: stopped every rank (exit code 124). Raise MINIDIST_JOB_TIMEOUT_S, or unset it for no limit." >&2
fi
exit "$rc"
