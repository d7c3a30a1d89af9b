"""Wing: fast paths, what the defaults run in place of the textbook all-reduces.

    ./mpirun.sh -n 2 python examples/train.py     # "auto" picks "shm" for DDP's buckets

The spine's ring, tree and recursive doubling (minidist/comm/algorithms/) move every byte as
point-to-point messages; the algorithms here use what one node or the MPI library offers:

    shm_window   MPI-3 shared-memory windows: DDP's buckets live in them (zero copy)
    shm          the shared-memory all-reduce: rank r sums slice r from every rank's window
    shm_gather   all-gather through the same windows
    mpi_native   MPI's own Allreduce (the "mpi" algorithm), with a fingerprint guard
    hier         several nodes: shm inside each node, ring or rd between the node leaders
    cuda_ipc     device buffers on one node: CUDA IPC handles (ipc_windows, ipc_device,
                 ipc_sync), and host_copy / ipc_host below the cut-over
    staging      device buffers over an MPI that is not CUDA-aware: pinned host chunks

Each algorithm ends with its registry entry (minidist/comm/algorithms/registry.py).
"""

from minidist.fastpath.attach import attach

attach()
