"""Mixed precision under DDP, on every rank under mpiexec; rank 0 prints ``RESULT {...}``.

    ./mpirun.sh -n 2 python tests/ddp/amp_rank.py DIR     # tests/ddp/test_amp_mpi.py

1. loss scaling alone (no autocast) gives the SAME BITS as no scaler: scaling by a power of two
   is exact, so the per-bucket fold (unscale right after the all-reduce) must be exact too;
   plain, with no_sync accumulation, and with overlap on/off;
2. autocast + scaler: parameters bit-identical on every rank, close to the float32 run;
3. inf injected on ONE rank only: every rank skips that step, backs off to the same scale,
   and the parameters stay bit-identical (and unchanged by the skipped step);
4. the fp16 and PowerSGD comm hooks compose with AMP; an overflow does not poison PowerSGD;
5. MasterWeights under DDP: float16 buckets (half the bytes), masters broadcast from rank 0,
   everything identical on every rank;
6. without a scaler, the non-finite warning names the rank where it started, once, then counts;
7. Trainer(amp=True): 4 epochs straight == 2 + resume + 2, bit for bit, scaler state included.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import traceback
from pathlib import Path

import numpy as np

import minidist
from minidist import amp, comm, nn, optim
from minidist.data import ArrayDataset
from minidist.ddp import DistributedDataParallel, PowerSGDState, fp16_compress_hook, powersgd_hook
from minidist.tensor import Tensor
from minidist.trainer import Trainer, TrainerConfig

B, D_IN, D_H, D_OUT = 4, 6, 16, 3


def build(seed=0):
    minidist.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, D_H), nn.ReLU(), nn.Linear(D_H, D_H), nn.ReLU(),
                         nn.Linear(D_H, D_OUT))


def data(steps, micro, world, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, micro, world * B, D_IN)).astype(np.float32)
    y = rng.integers(0, D_OUT, size=(steps, micro, world * B))
    return x, y


def digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def model_digest(model) -> str:
    return digest(model.state_dict().values())


def everywhere_same(value) -> bool:
    return len(set(map(str, comm.all_gather_object(value)))) == 1


def train(xs, ys, rank, *, scaler=None, autocast=False, master_weights=False, seed=0,
          inf_at=None, inf_rank=None, hook=None, hook_state=None, record=None, **ddp_kw):
    """Steps of DDP training; ``inf_at``: the step where rank ``inf_rank`` feeds an inf."""
    model = build(seed)
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if master_weights:
        opt = amp.MasterWeights(opt)
    ddp = DistributedDataParallel(model, **ddp_kw)
    if hook is not None:
        ddp.register_comm_hook(hook_state, hook)
    scaler = scaler or amp.GradScaler(enabled=False)
    loss_fn = nn.CrossEntropyLoss()
    micro = xs.shape[1]
    sl = slice(rank * B, (rank + 1) * B)
    for s in range(xs.shape[0]):
        before = model_digest(model)
        for m in range(micro):
            x = xs[s, m, sl].copy()
            if s == inf_at and rank == inf_rank and m == micro - 1:
                x[0, 0] = np.inf
            with np.errstate(over="ignore", invalid="ignore"):
                ctx = ddp.no_sync() if m < micro - 1 else _null()
                with ctx:
                    with amp.autocast("cpu", enabled=autocast):
                        loss = loss_fn(ddp(Tensor(x)), ys[s, m, sl]) / micro
                    scaler.scale(loss).backward()
        if record is not None:
            record.setdefault("folded", []).append(len(scaler._folded))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if record is not None:
            record.setdefault("scale", []).append(scaler.get_scale())
            record.setdefault("unchanged", []).append(before == model_digest(model))
    ddp.close()
    return model, opt, ddp


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def rel(a, b) -> float:
    return max(float(np.max(np.abs(x.astype(np.float64) - y) / (np.abs(y) + 1e-3)))
               for x, y in zip(a.state_dict().values(), b.state_dict().values()))


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))


def main(root: Path) -> None:
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    res: dict = {"world_size": world}
    steps = 3

    # 1. scaler without autocast == no scaler, bit for bit (the fold is exact)
    for micro in (1, 2):
        xs, ys = data(steps, micro, world)
        for overlap in (True, False):
            ref, _, _ = train(xs, ys, rank, overlap=overlap)
            rec: dict = {}
            got, _, ddp = train(xs, ys, rank, scaler=amp.GradScaler(), record=rec,
                                overlap=overlap)
            key = f"scaler_exact/micro{micro}/overlap{int(overlap)}"
            res[key] = (model_digest(got) == model_digest(ref)
                        and everywhere_same(model_digest(got)))
            res[key + "/folded_every_bucket"] = rec["folded"] == [len(ddp.buckets)] * steps

    # 2. autocast + scaler: identical on every rank, close to float32
    xs, ys = data(steps, 1, world)
    ref, _, _ = train(xs, ys, rank)
    got, _, _ = train(xs, ys, rank, scaler=amp.GradScaler(), autocast=True)
    res["amp/identical"] = everywhere_same(model_digest(got))
    res["amp/rel"] = rel(got, ref)

    # 3. inf on the last rank only, at step 1
    rec = {}
    got, _, _ = train(xs, ys, rank, scaler=amp.GradScaler(), autocast=True, inf_at=1,
                      inf_rank=world - 1, record=rec)
    res["inf_one_rank/scale"] = rec["scale"]
    res["inf_one_rank/unchanged"] = rec["unchanged"]
    res["inf_one_rank/same_scales"] = everywhere_same(rec["scale"])
    res["inf_one_rank/identical"] = everywhere_same(model_digest(got))

    # 4. comm hooks with AMP
    got, _, _ = train(xs, ys, rank, scaler=amp.GradScaler(), autocast=True,
                      hook=fp16_compress_hook)
    res["fp16_hook/identical"] = everywhere_same(model_digest(got))
    res["fp16_hook/rel"] = rel(got, ref)
    xs5, ys5 = data(5, 1, world, seed=3)
    state = PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=1,
                          min_compression_rate=0.0)
    rec = {}
    got, _, _ = train(xs5, ys5, rank, scaler=amp.GradScaler(), autocast=True,
                      hook=powersgd_hook, hook_state=state, inf_at=2, inf_rank=world - 1,
                      record=rec)
    res["powersgd/identical"] = everywhere_same(model_digest(got))
    res["powersgd/scale"] = rec["scale"]
    res["powersgd/state_finite"] = all(np.isfinite(e).all() for e in state.errors.values()) \
        and all(np.isfinite(q).all() for q in state.qs.values())
    res["powersgd/params_finite"] = all(np.isfinite(a).all() for a in got.state_dict().values())

    # 5. MasterWeights: every rank starts from different weights; DDP broadcasts the masters
    got, opt, ddp = train(xs, ys, rank, scaler=amp.GradScaler(), autocast=True,
                          master_weights=True, seed=rank)
    res["master/bucket_dtypes"] = sorted({str(b.spec.dtype) for b in ddp.buckets})
    res["master/identical"] = everywhere_same(model_digest(got)) and everywhere_same(
        digest(m.array for m in opt.masters()))
    ref32, _, _ = train(xs, ys, rank, seed=0)
    res["master/rel"] = rel(got, ref32)

    # 6. no scaler: NaN from the last rank, two steps -> one warning naming it, then counting
    handler = Collect()
    logging.getLogger("minidist").addHandler(handler)
    xs2, ys2 = data(2, 1, world)
    xs2[:, :, (world - 1) * B] = np.nan
    model = build()
    ddp = DistributedDataParallel(model)
    for s in range(2):
        with np.errstate(invalid="ignore"):
            nn.CrossEntropyLoss()(ddp(Tensor(xs2[s, 0, rank * B:(rank + 1) * B])),
                                  ys2[s, 0, rank * B:(rank + 1) * B]).backward()
        model.zero_grad()
    logging.getLogger("minidist").removeHandler(handler)
    warns = [m for lvl, m in handler.records if lvl >= logging.WARNING and "non-finite" in m]
    res["nonfinite/warnings"] = warns
    res["nonfinite/count"] = ddp.nonfinite_grad_steps
    ddp.close()

    # 7. Trainer(amp=True) resume is bit-exact, scaler state included
    def fit(ckdir, resume=False, stop=None):
        model = build()
        rng = np.random.default_rng(5)
        x = rng.normal(size=(96, D_IN)).astype(np.float32)
        ds = ArrayDataset(x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1))
        scaler = amp.GradScaler(init_scale=2.0 ** 20, growth_interval=3)
        trainer = Trainer(model, nn.CrossEntropyLoss(),
                          optim.AdamW(model.parameters(), lr=0.01),
                          TrainerConfig(epochs=4, batch_size=8, amp=True, verbose=False,
                                        checkpoint_dir=str(ckdir), checkpoint_every_n_epochs=1,
                                        resume=resume, stop_after_epochs=stop, seed=2),
                          scaler=scaler)
        hist = trainer.fit(ds)
        trainer.ddp.close()
        return model, hist, scaler

    a, ha, sa = fit(root / "straight")
    fit(root / "split", stop=2)
    b, hb, sb = fit(root / "split", resume=True)
    res["resume/bit_identical"] = model_digest(a) == model_digest(b)
    res["resume/history_same"] = ha.train_losses == hb.train_losses
    res["resume/scaler_same"] = sa.state_dict() == sb.state_dict()
    res["resume/scaler"] = sa.state_dict()
    res["resume/skipped"] = sa.skipped_steps
    res["resume/ranks_identical"] = everywhere_same(model_digest(b))

    if rank == 0:
        print("RESULT " + json.dumps(res), flush=True)
    comm.barrier()
    comm.destroy_process_group()


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]))
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        raise
