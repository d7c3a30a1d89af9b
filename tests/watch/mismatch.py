"""Ranks pass different shapes (rank 1 one element short): a clear CommError, not a hang.

    MINIDIST_DEBUG=1 ./mpirun.sh -n 3 python tests/watch/mismatch.py
Prints each rank's error and exits 0 when every rank raised CommError naming rank 1.
"""

import sys

import numpy as np

import minidist as md

md.init_process_group(timeout=20)
r = md.get_rank()
buf = np.ones(100 if r != 1 else 99, np.float32)
try:
    md.all_reduce(buf, algorithm=sys.argv[1] if len(sys.argv) > 1 else "ring")
except md.CommError as e:
    print(f"rank {r} caught: {e}", flush=True)
    ok = "rank 1 passed numel=99" in str(e)
    md.destroy_process_group()
    sys.exit(0 if ok else 3)
print(f"rank {r}: no error raised", flush=True)
sys.exit(4)
