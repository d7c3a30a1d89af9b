#!/usr/bin/env bash
# Run the whole test suite:   ./test.sh   (extra arguments go to pytest, e.g. ./test.sh -k ring -x)
#
# Creates/updates .venv on first use, then runs pytest. Multi-process tests start their own
# `mpiexec` ranks and TCP ranks with a timeout, so a hang fails a test instead of stalling.
# The CUDA kernels are tested under Numba's CUDA simulator in a separate process.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/bootstrap_venv.sh
source "$here/scripts/bootstrap_venv.sh"
cd "$here"
exec python -m pytest "$@"
