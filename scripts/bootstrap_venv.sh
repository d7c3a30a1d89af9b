# Sourced by mpirun.sh and test.sh: make sure the project's .venv exists and is up to date.
#
# First use creates .venv next to this repo and installs minidist (editable) with the
# [mpi,test] extras, which bring mpi4py, the mpich wheel (and its mpiexec) and pytest.
# The install is redone only when pyproject.toml changes (a stamp file holds its hash).
# Set MINIDIST_PYTHON to choose the interpreter that creates the venv (default: python3).
# MINIDIST_TEST_TORCH=1 adds the [torch] extra (torch's CPU build where the index has one), so
# the tests that compare minidist with torch run instead of skipping; CI sets it.
minidist_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
minidist_venv="$minidist_root/.venv"
_minidist_stamp="$minidist_venv/.minidist-installed"
_minidist_hash=$(sha256sum "$minidist_root/pyproject.toml" | cut -d' ' -f1)
_minidist_extras="mpi,test,bench"
case "${MINIDIST_TEST_TORCH:-0}" in
    1|true|yes|on|TRUE|True|YES|ON) _minidist_extras="$_minidist_extras,torch" ;;
    0|false|no|off|FALSE|False|NO|OFF|"") ;;
    *) echo "minidist: MINIDIST_TEST_TORCH='$MINIDIST_TEST_TORCH' is not valid: it accepts 1 (install torch for the parity tests) or 0 (default). Set such a value, or unset it." >&2
       exit 2 ;;
esac
_minidist_want="$_minidist_hash [$_minidist_extras]"
_minidist_have=$(cat "$_minidist_stamp" 2>/dev/null || true)
# A venv set up with torch serves a run without it too.
[ "$_minidist_have" = "$_minidist_hash [$_minidist_extras,torch]" ] && _minidist_want=$_minidist_have
if [ ! -x "$minidist_venv/bin/python" ] || [ "$_minidist_have" != "$_minidist_want" ]; then
    case "$_minidist_extras" in
        *torch*) echo "minidist: setting up $minidist_venv with torch for the parity tests (first run only, a minute or two; about 850 MB)..." >&2 ;;
        *) echo "minidist: setting up $minidist_venv (first run only, about a minute)..." >&2 ;;
    esac
    if [ ! -x "$minidist_venv/bin/python" ]; then
        "${MINIDIST_PYTHON:-python3}" -m venv "$minidist_venv" || {
            echo "minidist: MINIDIST_PYTHON='${MINIDIST_PYTHON:-python3}' could not create a virtual environment: it accepts a Python 3 interpreter with the venv module (install python3-venv, or set MINIDIST_PYTHON to another python3)" >&2
            exit 1
        }
    fi
    "$minidist_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -e "$minidist_root[$_minidist_extras]" >&2 || {
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
