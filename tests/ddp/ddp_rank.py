"""DDP checks run on every rank under mpiexec; rank 0 prints one JSON line ``RESULT {...}``.

    ./mpirun.sh -n 4 python tests/ddp/ddp_rank.py       # tests/ddp/test_ddp_mpi.py runs it

Every check is a body valid at any world size. The oracle is one process training on the
GLOBAL batch (every rank computes it locally, the way horovod/chainermn tests do): DDP over n
ranks x batch B must give the parameters of one process x batch n*B. Models are float64, so
the only difference is summation order (all-reduce sums ranks' means in a different order than
one mean over n*B rows): about 1e-16 relative per step; we allow rtol=atol=1e-10 after 3 steps.
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback

import numpy as np

from minidist import comm
from minidist.ddp import DistributedDataParallel, PowerSGDState, fp16_compress_hook, powersgd_hook
from minidist.nn.module import Module, Parameter
from minidist.optim import SGD, AdamW
from minidist.tensor import Tensor

TOL = dict(rtol=1e-10, atol=1e-10)
B, D_IN, D_H, D_OUT = 4, 6, 10, 3


class Net(Module):
    """A float64 two-layer MLP; ``extra`` adds a branch that forward never uses."""

    def __init__(self, seed: int = 0, extra: bool = False, hidden: int = D_H) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = Parameter(rng.normal(size=(D_IN, hidden)) / 3)
        self.b1 = Parameter(rng.normal(size=hidden) / 10)
        if extra:
            self.unused = Parameter(rng.normal(size=(hidden, 2)))
        self.w2 = Parameter(rng.normal(size=(hidden, D_OUT)) / 3)
        self.b2 = Parameter(np.zeros(D_OUT))

    def forward(self, x):
        return (x @ self.w1 + self.b1).tanh() @ self.w2 + self.b2


def loss_fn(out, y):
    return ((out - Tensor(y)) ** 2).mean()


def data(steps: int, micro: int, world: int, seed: int = 1):
    """Global batches: steps x micro x (world*B) rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, micro, world * B, D_IN))
    y = rng.normal(size=(steps, micro, world * B, D_OUT))
    return x, y


def make_opt(name, params):
    if name == "sgd":
        return SGD(params, lr=0.1, momentum=0.9)
    return AdamW(params, lr=0.01, weight_decay=0.01)


def train_reference(opt_name, xs, ys, extra=False):
    model = Net(extra=extra)
    opt = make_opt(opt_name, list(model.parameters()))
    for s in range(xs.shape[0]):
        xg = xs[s].reshape(-1, D_IN)
        yg = ys[s].reshape(-1, D_OUT)
        loss_fn(model(Tensor(xg)), yg).backward()
        opt.step()
        opt.zero_grad()
    return model


def train_ddp(opt_name, xs, ys, rank, *, extra=False, **ddp_kwargs):
    model = Net(seed=rank * 7 + 3 if rank else 0, extra=extra)  # other ranks start different:
    ddp = DistributedDataParallel(model, **ddp_kwargs)          # the broadcast must fix that
    opt = make_opt(opt_name, list(model.parameters()))
    micro = xs.shape[1]
    sl = slice(rank * B, (rank + 1) * B)
    for s in range(xs.shape[0]):
        for m in range(micro):
            x, y = Tensor(xs[s, m, sl]), ys[s, m, sl]
            if m < micro - 1:
                with ddp.no_sync():
                    (loss_fn(ddp(x), y) / micro).backward()
            else:
                (loss_fn(ddp(x), y) / micro).backward()
        opt.step()
        opt.zero_grad()
    ddp.close()
    return model


def digest(model) -> str:
    h = hashlib.sha256()
    for _, a in model.state_dict().items():
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def max_rel_diff(a, b) -> float:
    out = 0.0
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        out = max(out, float(np.max(np.abs(x - y) / (np.abs(y) + 1e-10))))
    return out


def close(a, b) -> bool:
    return all(np.allclose(x, y, **TOL) for x, y in
               zip(a.state_dict().values(), b.state_dict().values()))


def identical_everywhere(model) -> bool:
    return len(set(comm.all_gather_object(digest(model)))) == 1


def expect_error(fn, exc=Exception) -> str:
    try:
        fn()
    except exc as e:  # every rank raises the same error: nobody is left waiting
        return str(e)
    return ""


def main() -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    res: dict = {"world_size": world}
    steps = 3

    # 1. equivalence with the big-batch single process: SGD/AdamW x accumulation x algorithm
    for opt_name in ("sgd", "adamw"):
        for micro in (1, 2):
            xs, ys = data(steps, micro, world)
            ref = train_reference(opt_name, xs, ys)
            for algo in ("auto", "ring", "tree", "rd", "direct", "mpi"):
                if micro == 2 and algo not in ("auto", "ring"):
                    continue
                if algo == "mpi" and comm.get_default_group().backend != "mpi":
                    continue  # capability, the same on every rank
                m = train_ddp(opt_name, xs, ys, rank, algorithm=algo)
                key = f"{opt_name}/micro{micro}/{algo}"
                res[key] = {"identical": identical_everywhere(m), "close": close(m, ref),
                            "rel": max_rel_diff(m, ref)}

    # 2. overlap off gives the same bits as overlap on; tiny buckets (one param each) too
    xs, ys = data(steps, 1, world)
    a = train_ddp("sgd", xs, ys, rank, overlap=True)
    b = train_ddp("sgd", xs, ys, rank, overlap=False)
    c = train_ddp("sgd", xs, ys, rank, bucket_cap_mb=1e-6, first_bucket_cap_mb=1e-6)
    res["overlap_off_same_bits"] = digest(a) == digest(b)
    res["tiny_buckets_close"] = close(c, a)

    # 3. find_unused_parameters: the unused branch is reduced as zeros, training matches
    ref = train_reference("sgd", xs, ys, extra=True)
    m = train_ddp("sgd", xs, ys, rank, extra=True, find_unused_parameters=True)
    res["unused/close"] = close(m, ref) and identical_everywhere(m)
    res["unused/grad_zero"] = m.unused.grad is None or not np.any(m.unused.grad)
    # ... and without the flag: a clear error at the end of that backward, naming the parameter
    res["unused/error"] = expect_error(
        lambda: train_ddp("sgd", xs, ys, rank, extra=True), RuntimeError)

    # 4. different models on different ranks: a clear error on every rank, not a hang
    def mismatched():
        DistributedDataParallel(Net(hidden=D_H + (1 if rank == world - 1 else 0)))
    res["mismatch_error"] = expect_error(mismatched, RuntimeError) if world > 1 else "n/a"

    # 5. comm hooks
    f16 = train_ddp("sgd", xs, ys, rank, comm_hook=fp16_compress_hook)
    res["fp16/identical"] = identical_everywhere(f16)
    res["fp16/rel"] = max_rel_diff(f16, a)
    full_rank = PowerSGDState(matrix_approximation_rank=D_IN, start_powerSGD_iter=0,
                              min_compression_rate=0.0)
    model = Net()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(full_rank, powersgd_hook)
    xb = Tensor(xs[0, 0, rank * B:(rank + 1) * B])
    loss_fn(ddp(xb), ys[0, 0, rank * B:(rank + 1) * B]).backward()
    ref = Net()
    loss_fn(ref(Tensor(xs[0, 0].reshape(-1, D_IN))), ys[0, 0].reshape(-1, D_OUT)).backward()
    res["powersgd/full_rank_exact"] = all(
        np.allclose(p.grad, q.grad, rtol=1e-8, atol=1e-10)
        for p, q in zip(model.parameters(), ref.parameters()))
    ddp.close()
    model = Net()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=1,
                                         min_compression_rate=0.0), powersgd_hook)
    opt = make_opt("sgd", list(model.parameters()))
    for s in range(steps):
        loss_fn(ddp(Tensor(xs[s, 0, rank * B:(rank + 1) * B])),
                ys[s, 0, rank * B:(rank + 1) * B]).backward()
        opt.step()
        opt.zero_grad()
    ddp.close()
    res["powersgd/rank1_identical"] = identical_everywhere(model)
    xg, yg = Tensor(xs[:, 0].reshape(-1, D_IN)), ys[:, 0].reshape(-1, D_OUT)
    res["powersgd/rank1_loss_drops"] = (loss_fn(model(xg), yg).item()
                                        < loss_fn(Net()(xg), yg).item())

    # 6. NaN on one rank: after the all-reduce every rank sees it; "raise" names the parameter
    model = Net()
    ddp = DistributedDataParallel(model, nonfinite_grads="raise")
    xb = xs[0, 0, rank * B:(rank + 1) * B].copy()
    if rank == world - 1:
        xb[0, 0] = np.nan
    res["nan_error"] = expect_error(
        lambda: loss_fn(ddp(Tensor(xb)), ys[0, 0, :B]).backward(), FloatingPointError)
    ddp.close()

    # 7. an exception inside a comm hook reaches the main thread, naming the bucket
    def broken_hook(state, bucket):
        raise OSError("wire cut")
    model = Net()
    ddp = DistributedDataParallel(model, comm_hook=broken_hook)
    res["hook_error"] = expect_error(
        lambda: loss_fn(ddp(Tensor(xs[0, 0, :B])), ys[0, 0, :B]).backward(), RuntimeError)
    ddp.close()

    # 8. wrapper API: state_dict keys with torch's "module." prefix, grads are bucket views
    model = Net()
    ddp = DistributedDataParallel(model)
    res["state_dict_keys"] = list(ddp.state_dict())
    res["grads_are_views"] = all(
        any(np.shares_memory(p.grad, b.buffer) for b in ddp.buckets) for p in model.parameters())
    ddp.close()

    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        raise
