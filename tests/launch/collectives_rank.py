"""Run under mpiexec at any size: every algorithm x op x dtype, and every collective, checked.

    ./mpirun.sh -n 4 python tests/launch/collectives_rank.py

Each rank slices its input from one seeded world array, so it knows the expected answer.
Results are compared with NumPy (tolerance per dtype), with MPI's own Allreduce (exact for
integers) and, through MPI's own Allgather, bit for bit across ranks. Exits non-zero with a
message on the first mismatch (the excepthook installed by init_process_group aborts the job).
"""

import numpy as np
from mpi4py import MPI

import minidist as md
from minidist.comm.ops import ReduceOp, reference_reduce
from minidist.comm.transports.mpi import mpi_cuda_aware

TOL = {"float16": 3e-2, "float32": 1e-5, "float64": 1e-12}


def world(n, count, dtype, op, seed):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i":
        hi = 3 if op is ReduceOp.PROD else 1000
        return rng.integers(-hi, hi, size=(n, count)).astype(dtype)
    if op is ReduceOp.PROD:
        return rng.uniform(0.5, 1.5, size=(n, count)).astype(dtype)
    return rng.normal(size=(n, count)).astype(dtype)


def same_bits_everywhere(buf, what):
    rows = MPI.COMM_WORLD.allgather(buf.tobytes())  # MPI's own gather, independent of ours
    bad = [r for r, b in enumerate(rows) if b != rows[0]]
    if bad:
        raise SystemExit(f"{what}: ranks {bad} differ in bits from rank 0")


def main():
    g = md.init_process_group(backend="auto")
    n, r = md.get_world_size(), md.get_rank()
    assert g.backend == "mpi" and n == MPI.COMM_WORLD.Get_size(), (g.backend, n)
    aware = mpi_cuda_aware()
    if aware:
        raise SystemExit(f"the PyPI MPI wheel should not be CUDA-aware, probe said {aware}")
    seed = 0
    for dtype in ("float16", "float32", "float64", "int32", "int64"):
        for op in ReduceOp:
            for count in (0, 1, n + 1, 4099):
                seed += 1
                data = world(n, count, dtype, op, seed)
                expected = reference_reduce(list(data), op)
                native = data[r].copy()
                md.all_reduce(native, op=op, algorithm="mpi")
                for algo in ("direct", "ring", "tree", "rd", "auto"):
                    buf = data[r].copy()
                    md.all_reduce(buf, op=op, algorithm=algo)
                    what = f"all_reduce(algorithm={algo}, op={op.value}, {dtype}, count={count})"
                    same_bits_everywhere(buf, what)
                    if np.dtype(dtype).kind == "i":
                        if not np.array_equal(buf, native) or not np.array_equal(buf, expected):
                            raise SystemExit(f"{what}: differs from MPI/NumPy")
                    elif not np.allclose(buf.astype(np.float64), expected.astype(np.float64),
                                         rtol=TOL[dtype] * n, atol=TOL[dtype] * n):
                        raise SystemExit(f"{what}: max error "
                                         f"{np.abs(buf.astype(np.float64) - expected).max()}")
    # a large prime count through the Rabenseifner branch and uneven ring chunks
    data = world(n, 65537, "float32", ReduceOp.SUM, 99)
    for algo in ("ring", "rd", "tree", "mpi"):
        buf = data[r].copy()
        md.all_reduce(buf, algorithm=algo)
        same_bits_everywhere(buf, f"65537 x float32 {algo}")
        np.testing.assert_allclose(buf, data.sum(0), rtol=1e-4, atol=1e-4)

    x = np.arange(12, dtype=np.float64).reshape(3, 4) + 100 * r
    for src in range(n):
        b = x.copy()
        md.broadcast(b, src=src)
        np.testing.assert_array_equal(b, np.arange(12.0).reshape(3, 4) + 100 * src)
        c = x.copy()
        md.reduce(c, dst=src, op="sum")
        want = sum(np.arange(12.0).reshape(3, 4) + 100 * k for k in range(n)) if r == src else x
        np.testing.assert_array_equal(c, want)
    gathered = md.all_gather(x)
    np.testing.assert_array_equal(gathered, [np.arange(12.0).reshape(3, 4) + 100 * k
                                             for k in range(n)])
    out = np.empty(n * 12)
    md.all_gather_into(out, x)
    np.testing.assert_array_equal(out, gathered.reshape(-1))
    chunk = np.empty(5, np.int64)
    md.reduce_scatter(chunk, np.arange(5 * n, dtype=np.int64) * (r + 1), op="sum")
    np.testing.assert_array_equal(chunk, np.arange(5 * r, 5 * r + 5) * (n * (n + 1) // 2))
    names = md.all_gather_object({"rank": r, "local": md.get_local_rank()})
    assert names == [{"rank": k, "local": k} for k in range(n)], names
    assert md.broadcast_object({"step": 7} if r == 0 else None) == {"step": 7}
    md.barrier()
    if md.is_main_process():
        print(f"collectives ok at n={n}", flush=True)
    md.destroy_process_group()


if __name__ == "__main__":
    main()
