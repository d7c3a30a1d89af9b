"""The CUDA-IPC protocol on host windows ("ipc_host") between MPI processes of one node: the
header rows and phase flags live in MPI shared windows, as the GPU's flags live in IPC-mapped
device memory. Equal to the rank-order reduction, bit for bit, on every rank; a mismatched
numel raises on every rank; the host never syncs a stream; close_ipc frees every window.

    mpiexec -n 3 python tests/fastpath/ipc_host_rank.py
"""

import numpy as np

from minidist import comm
from minidist.fastpath.cuda_ipc import close_ipc, ipc_state
from minidist.comm.errors import CollectiveMismatch
from minidist.comm.ops import reference_reduce
from minidist.fastpath.shm_window import shm_close, shm_node

comm.init_process_group(backend="mpi")
group = comm.get_default_group()
rank, world = comm.get_rank(), comm.get_world_size()

for numel in (1, 1000, 300_000, 4099, 0):
    for dtype, op in ((np.float32, "sum"), (np.float32, "avg"), (np.float16, "sum"),
                      (np.int32, "max"), (np.float64, "min")):
        inputs = [(np.random.default_rng(r + numel).standard_normal(numel) * 8).astype(dtype)
                  for r in range(world)]
        for _ in range(3):  # both halves, then the first again
            x = inputs[rank].copy()
            group.all_reduce(x, op=op, algorithm="ipc_host")
            want = reference_reduce([a.copy() for a in inputs], op)
            assert np.array_equal(x.view(np.uint8), want.view(np.uint8)), (numel, dtype, op)

try:
    group.all_reduce(np.ones(10 + rank, np.float32), algorithm="ipc_host")
except CollectiveMismatch as e:
    assert "ipc_host" in str(e) or "cuda_ipc" in str(e), e
else:
    raise AssertionError("a mismatched numel went through")

if world > 1:
    state = ipc_state(group.transport, "host")
    assert state.windows.syncs == 0, state.windows.syncs  # the host is the stream: no sync
    assert state.plans_built <= 2 * 5 * 4 + 2, state.plans_built  # per half x shape, no more
    close_ipc(group.transport)  # what destroy_process_group does (collective)
    assert shm_node(group.transport).user_windows == [], "IPC windows left after close_ipc"
    # python -m minidist.tune frees the node's windows (shm_close) before it destroys the group:
    # the IPC state made before that must still close cleanly in destroy_process_group
    group.all_reduce(np.ones(10, np.float32), algorithm="ipc_host")
    shm_close(group.transport)
print(f"[rank {rank}] ipc_host ok", flush=True)
comm.destroy_process_group()
