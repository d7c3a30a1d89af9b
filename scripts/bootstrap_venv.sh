# Sourced by mpirun.sh and test.sh: make sure the project's .venv exists and is up to date.
#
# First use creates .venv next to this repo and installs minidist (editable) with the
# [mpi,test] extras, which bring mpi4py, the mpich wheel (and its mpiexec) and pytest.
# The install is redone only when pyproject.toml changes (a stamp file holds its hash).
# Set MINIDIST_PYTHON to choose the interpreter that creates the venv (default: python3).
minidist_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
minidist_venv="$minidist_root/.venv"
_minidist_stamp="$minidist_venv/.minidist-installed"
_minidist_want=$(sha256sum "$minidist_root/pyproject.toml" | cut -d' ' -f1)
if [ ! -x "$minidist_venv/bin/python" ] || [ "$(cat "$_minidist_stamp" 2>/dev/null)" != "$_minidist_want" ]; then
    echo "minidist: setting up $minidist_venv (first run only, about a minute)..." >&2
    if [ ! -x "$minidist_venv/bin/python" ]; then
        "${MINIDIST_PYTHON:-python3}" -m venv "$minidist_venv" || {
            echo "minidist: MINIDIST_PYTHON='${MINIDIST_PYTHON:-python3}' could not create a virtual environment: it accepts a Python 3 interpreter with the venv module (install python3-venv, or set MINIDIST_PYTHON to another python3)" >&2
            exit 1
        }
    fi
    "$minidist_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -e "$minidist_root[mpi,test,bench]" >&2 || {
        echo "minidist: pip install failed (see above); fix the network/index and run again" >&2
        exit 1
    }
    echo "$_minidist_want" > "$_minidist_stamp"
fi
export PATH="$minidist_venv/bin:$PATH"
# One BLAS/OpenMP thread per process: ranks share few cores, and oversubscribed BLAS threads
# make every rank slower (users may override by exporting their own values).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
export MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
export NUMBA_NUM_THREADS="${NUMBA_NUM_THREADS:-1}"
