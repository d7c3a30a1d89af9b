"""The main job: train a classifier data-parallel with DistributedDataParallel + Trainer.

Run (from the repository root):

    ./mpirun.sh -n 4 python examples/train.py                   # 4 ranks, MLP on the digits
    ./mpirun.sh -n 4 python examples/train.py --model cnn       # small CNN on 1x8x8 images
    ./mpirun.sh -n 4 python examples/train.py --model cnn --bn  # ... with BatchNorm2d
    .venv/bin/python examples/train.py                          # one process, no mpiexec
    ./mpirun.sh -n 2 python examples/train.py --checkpoint-dir runs/a --save-model runs/a/model.npz
    ./mpirun.sh -n 2 python examples/train.py --checkpoint-dir runs/a --resume   # after a crash
    ./mpirun.sh -n 2 python examples/train.py --checkpoint-dir runs/b --checkpoint-every 1 --keep-last 2
    .venv/bin/python examples/train.py --dataset mnist --data-root ~/data/mnist --epochs 3
    ./mpirun.sh -n 4 python examples/train.py --amp              # mixed precision (docs/amp.md)
    ./mpirun.sh -n 4 python examples/train.py --amp --master-weights   # float16 weights too
    ./mpirun.sh -n 2 python examples/train.py --device cuda --amp  # GPU LOCAL_RANK, real float16
    ./mpirun.sh -n 4 python examples/train.py --zero             # ZeRO-1: 1/4 of the AdamW state per rank

Rank 0 prints one line per epoch (loss and accuracy averaged over all ranks, validation on the
test split, samples/s) and a final ``final test_acc`` line. The same ``--seed`` gives the same
numbers bit for bit for the same launch (under ``--algorithm auto`` another transport may sum the
gradients in another order: README.md says why). What one step does on every rank:

    DistributedSampler (seed + epoch, one shard per rank) -> model(x) -> CrossEntropyLoss
    -> backward (gradient buckets all-reduced while backward runs, docs/how_ddp_works.md)
    -> optimizer.step() (AdamW, identical on every rank) -> scheduler.step() (warm-up + cosine)

``--batch-size`` is per rank; the learning rate is scaled by the world size (``--lr-scaling
linear``, Goyal et al. 2017), so ``--lr`` is the rate for ONE rank's batch.

``--amp`` runs forward and loss under ``amp.autocast`` (float16 matmul/conv: real on a GPU,
emulated on the CPU, where it is slower, not faster) with dynamic loss scaling; steps whose
gradients overflow are skipped on every rank alike. ``--master-weights`` also keeps the model
weights in float16 (fp32 master copies in the optimizer; gradients all-reduced in float16).
``--device cuda`` puts each rank on GPU ``LOCAL_RANK`` (modulo the GPU count).
"""

from __future__ import annotations

import os

# One BLAS thread per process, set before NumPy loads: ranks share the cores, and a
# multi-threaded BLAS spinning on a busy machine is much slower (mpirun.sh sets it too).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import math
import sys
import time
from dataclasses import dataclass, fields

import numpy as np

from minidist import amp, comm, nn, optim
from minidist import xp as backend
from minidist.checkpoint import CheckpointError
from minidist.data import find_idx_files, load_dataset
from minidist.data.datasets import DOWNLOAD_FROM
from minidist.ddp import DistributedDataParallel, ZeroRedundancyOptimizer
from minidist.tensor import Tensor, no_grad, use_deterministic_algorithms
from minidist.trainer import Trainer, TrainerConfig, TrainingDiverged


@dataclass
class Config:
    """Every flag of train.py: ``--batch-size`` sets ``batch_size``; the help text is in HELP."""
    epochs: int = 50
    batch_size: int = 16
    lr: float = 3e-3
    lr_scaling: str = "linear"
    model: str = "mlp"
    bn: bool = False
    hidden: str = "512,256"
    dropout: float = 0.3
    optimizer: str = "adamw"
    weight_decay: float = 0.05
    warmup_epochs: float = 2.0
    grad_accum_steps: int = 1
    seed: int = 0
    dataset: str = "digits"
    data_root: str | None = None
    algorithm: str = "auto"
    bucket_cap_mb: float = 25.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 5
    resume: bool = False
    resume_if_present: bool = False
    keep_last: int = 0
    stop_after_epochs: int = 0
    save_model: str | None = None
    progress_bar: bool = False
    amp: bool = False
    master_weights: bool = False
    device: str | None = None
    zero: bool = False
    allow_nonfinite: bool = False
    deterministic: bool = False


# One help line per Config field (`--help` appends the default); test_examples checks that
# every flag has one.
HELP = {
    "epochs": "epochs to train (the warm-up + cosine schedule spans all of them)",
    "batch_size": "samples per step PER RANK; the effective batch is batch-size x world size",
    "lr": "learning rate for ONE rank's batch; the optimizer runs at lr x the --lr-scaling "
          "factor of the world size (sgd: try 0.05)",
    "lr_scaling": "how lr grows with the world size n: linear (lr x n, Goyal et al. 2017), "
                  "sqrt (lr x sqrt(n)) or none (lr as given)",
    "model": "mlp on flat features, or cnn on (C, H, W) images",
    "bn": "CNN only: BatchNorm2d after each convolution (running statistics kept equal on "
          "every rank by DDP's broadcast_buffers)",
    "hidden": "MLP only: hidden layer widths, comma-separated",
    "dropout": "MLP only: dropout probability after each hidden layer",
    "optimizer": "adamw, or sgd with momentum 0.9 (then use --lr 0.05 --weight-decay 5e-4)",
    "weight_decay": "weight decay of the optimizer",
    "warmup_epochs": "epochs of linear warm-up, then cosine decay over the rest; at most "
                     "--epochs (the default shrinks to --epochs on a shorter run)",
    "grad_accum_steps": "micro-batches per optimizer step (all but the last under no_sync)",
    "seed": "seed of the weights, dropout and shuffling: the same seed gives the same numbers "
            "for the same launch (another transport may pick another all-reduce algorithm "
            "under --algorithm auto, whose sums round differently: see README.md)",
    "dataset": "digits (bundled), mnist / fashion-mnist (IDX files in --data-root) or synthetic",
    "data_root": "folder holding the MNIST / Fashion-MNIST IDX files (docs/data.md says where "
                 "to get them)",
    "algorithm": "all-reduce algorithm of the gradient buckets (auto picks by size)",
    "bucket_cap_mb": "gradient bucket size in MiB (as torch's bucket_cap_mb)",
    "checkpoint_dir": "folder for checkpoints and history.json (none: no checkpoints)",
    "checkpoint_every": "epochs between checkpoints (one is also written after the last epoch)",
    "resume": "continue from the newest checkpoint in --checkpoint-dir, at the same world size "
              "(an error if the folder holds none)",
    "resume_if_present": "like --resume, but start fresh when --checkpoint-dir holds no "
                         "checkpoint yet (a job resubmitted with the same command)",
    "keep_last": "keep only the newest N checkpoints in --checkpoint-dir (0: keep all)",
    "stop_after_epochs": "end after this many epochs of this run, counted from where it "
                         "started or resumed (a time-limited job; 0: run all --epochs); the "
                         "schedule still spans --epochs",
    "save_model": "write the final weights to this .npz (torch's state_dict keys)",
    "progress_bar": "rank 0 draws a progress bar per epoch",
    "amp": "float16 autocast + dynamic loss scaling (real on a GPU, emulated on the CPU)",
    "master_weights": "float16 model weights with float32 master copies (implies --amp)",
    "device": "cpu (NumPy) or cuda (CuPy, GPU LOCAL_RANK); none: MINIDIST_DEVICE, else cpu",
    "zero": "ZeRO-1: each rank keeps 1/world-size of the optimizer state (docs/memory.md)",
    "allow_nonfinite": "train on when a step's gradient goes NaN/inf (default: stop the run "
                       "there, in one line naming the step and the parameters)",
    "deterministic": "the same bits on any machine: products and exp/log in a fixed order "
                     "(md.use_deterministic_algorithms; slower, README.md quotes this mode)",
}

CHOICES = {"model": ["mlp", "cnn"], "optimizer": ["sgd", "adamw"],
           "lr_scaling": ["none", "linear", "sqrt"],
           "dataset": ["digits", "mnist", "fashion-mnist", "synthetic"],
           "algorithm": ["auto", "ring", "tree", "rd", "shm", "hier", "direct", "mpi"],
           "device": ["cpu", "cuda"]}


class UsageError(Exception):
    """A mistake in the command line or in the files it names: rank 0 says it in one line."""


def job_rank() -> int:
    """This process's rank: from the process group once there is one, else from the launcher."""
    if comm.is_initialized():
        return comm.get_rank()
    try:
        return comm.detect_launch().rank
    except ValueError:  # a malformed launcher variable: init_process_group will say which
        return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's usage block, once per rank: too much
        raise UsageError(f"{message} (see --help)")


# Flags whose value must pass a check, and the rule in words (checked before any process group).
LIMITS = {"epochs": (lambda v: v >= 1, ">= 1"), "batch_size": (lambda v: v >= 1, ">= 1"),
          "lr": (lambda v: v > 0, "> 0"), "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
          "weight_decay": (lambda v: v >= 0, ">= 0"),
          "warmup_epochs": (lambda v: v >= 0, ">= 0"),
          "grad_accum_steps": (lambda v: v >= 1, ">= 1"),
          "bucket_cap_mb": (lambda v: v > 0, "> 0"),
          "checkpoint_every": (lambda v: v >= 1, ">= 1"),
          "keep_last": (lambda v: v >= 0, ">= 0 (0: keep all)"),
          "stop_after_epochs": (lambda v: v >= 0, ">= 0 (0: run all --epochs)")}


def parse_args(argv: list[str] | None = None) -> Config:
    """Parse and check the command line (values, data files); raise UsageError if wrong.

    Everything here runs before ``init_process_group``: a mistake costs no rank a hang.
    """
    parser = _Parser(description=__doc__.split("\n")[0])
    for f in fields(Config):
        flag, value = "--" + f.name.replace("_", "-"), f.default
        help_text = f"{HELP[f.name]} (default: %(default)s)"
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value, help=help_text)
        else:
            kind = type(value) if value is not None else str
            parser.add_argument(flag, type=kind, default=value, choices=CHOICES.get(f.name),
                                help=help_text)
    cfg = Config(**vars(parser.parse_args(argv)))
    for name, (ok, rule) in LIMITS.items():
        if not ok(getattr(cfg, name)):
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {getattr(cfg, name)} is out of range; it must be {rule}")
    parse_widths(cfg.hidden)
    if cfg.dataset in DOWNLOAD_FROM:
        if cfg.data_root is None:
            raise UsageError(f"--dataset {cfg.dataset} needs --data-root DIR, a folder with its "
                             f"four IDX files (get them from {DOWNLOAD_FROM[cfg.dataset]}); or "
                             "use --dataset digits, which needs no download")
        try:
            find_idx_files(cfg.dataset, cfg.data_root)
        except FileNotFoundError as e:
            raise UsageError(f"--data-root {cfg.data_root}: {str(e).split(': ', 1)[1]}") from None
    if (cfg.resume or cfg.resume_if_present or cfg.keep_last) and not cfg.checkpoint_dir:
        flag = ("--resume" if cfg.resume else "--resume-if-present" if cfg.resume_if_present
                else "--keep-last")
        parser.error(f"{flag} needs --checkpoint-dir DIR")
    if cfg.warmup_epochs > cfg.epochs:
        if any(a.startswith("--warmup-epochs") for a in (sys.argv[1:] if argv is None else argv)):
            parser.error(f"--warmup-epochs {cfg.warmup_epochs:g} is longer than --epochs "
                         f"{cfg.epochs}: the learning rate would never reach --lr; use at most "
                         f"--warmup-epochs {cfg.epochs}")
        cfg.warmup_epochs = float(cfg.epochs)  # the default 2 on a shorter run: warm up over it
    if cfg.dataset == "synthetic" and cfg.model == "cnn":
        parser.error("--model cnn needs image data; use --model mlp with --dataset synthetic")
    if cfg.bn and cfg.model != "cnn":
        parser.error("--bn adds BatchNorm2d to the CNN; use it with --model cnn")
    cfg.amp = cfg.amp or cfg.master_weights
    if cfg.zero and cfg.amp:
        parser.error("--zero does not combine with --amp (loss scaling needs the whole "
                     "averaged gradient, ZeRO keeps only this rank's shard); drop one")
    return cfg


def use_device(device: str | None) -> None:
    """``--device``: cpu (NumPy), or cuda: CuPy on GPU LOCAL_RANK (modulo the GPU count).

    Raises:
        DeviceUnavailableError: cuda without CuPy or without a usable GPU (says which).
    """
    if device is None:
        backend.default_array_module()  # checks MINIDIST_DEVICE
        return
    if device == "cuda":
        cupy = backend.require_cuda(cpu_hint="--device cpu")  # the flag wins over the variable
        n_gpus = cupy.cuda.runtime.getDeviceCount()
        # Before init_process_group: a CUDA-aware MPI must see the device chosen first.
        cupy.cuda.Device(comm.get_local_rank() % n_gpus).use()
    backend.set_default_device(device)


# ------------------------------------------------------------------------------- model
def build_model(kind: str, sample_shape: tuple[int, ...], n_classes: int,
                dropout: float = 0.0, hidden: tuple[int, ...] = (512, 256), bn: bool = False
                ) -> nn.Module:
    """An MLP on flat features (Linear-ReLU-Dropout per hidden width), or a CNN on (C, H, W)
    (Conv-ReLU twice, with ``bn`` Conv-BatchNorm2d-ReLU)."""
    if kind == "mlp":
        (width,) = sample_shape
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        return nn.Sequential(*layers, nn.Linear(width, n_classes))
    c, h, w = sample_shape

    def conv(c_in: int, c_out: int) -> list[nn.Module]:
        norm = [nn.BatchNorm2d(c_out)] if bn else []
        return [nn.Conv2d(c_in, c_out, 3, padding=1), *norm, nn.ReLU()]

    return nn.Sequential(*conv(c, 16), *conv(16, 32), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * (h // 2) * (w // 2), 64), nn.ReLU(),
                         nn.Linear(64, n_classes))


def parse_widths(text: str) -> tuple[int, ...]:
    """``"256,128"`` -> ``(256, 128)``; a clear error for anything else."""
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        widths = ()
    if not widths or min(widths) < 1:
        raise UsageError(f"--hidden {text!r} must be positive layer widths separated by "
                         "commas, e.g. --hidden 256,128")
    return widths


def check_float16_path(model: nn.Module, sample: np.ndarray, device_type: str, kind: str) -> None:
    """--amp on a model that autocast would not change: UsageError (one line from rank 0)."""
    model.eval()  # no dropout: this look-ahead draws no random numbers
    with no_grad(), amp.autocast(device_type) as ac:
        model(Tensor(backend.to_device(sample)))
    model.train()
    if ac.lower_precision_ops == 0:
        raise UsageError(f"--amp: model {kind!r} runs no op in float16 under autocast "
                         "(only matmul, linear and conv2d on float32 inputs do); drop --amp")


def build_optimizer(cfg: Config, model: nn.Module, ddp: DistributedDataParallel | None = None
                    ) -> optim.Optimizer:
    # fused=True: one compiled pass per tensor (same bits as the NumPy path; docs/gpu.md)
    if cfg.zero:  # the same optimizer, its state sharded over the ranks (minidist.memory.zero)
        cls, kw = ((optim.AdamW, dict(weight_decay=cfg.weight_decay)) if cfg.optimizer == "adamw"
                   else (optim.SGD, dict(momentum=0.9, weight_decay=cfg.weight_decay)))
        return ZeroRedundancyOptimizer(model.parameters(), cls, ddp=ddp, lr=cfg.lr, fused=True,
                                       **kw)
    if cfg.optimizer == "adamw":
        return optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay,
                           fused=True)
    return optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, weight_decay=cfg.weight_decay,
                     fused=True)


def save_weights(model: nn.Module, path: str) -> None:
    """Rank 0 writes ``state_dict()`` as .npz (torch keys, plain arrays), atomically."""
    if comm.get_rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}.npz"
        np.savez(tmp, **{k: np.asarray(v) for k, v in model.state_dict().items()})
        os.replace(tmp, path)
        print(f"saved model weights to {path}", flush=True)
    comm.barrier()


def main(argv: list[str] | None = None) -> float:
    cfg = parse_args(argv)
    try:
        use_device(cfg.device)  # a missing GPU stack: one clear line, not a traceback
    except (backend.DeviceUnavailableError, ValueError) as e:
        raise UsageError(str(e)) from None
    comm.init_process_group()
    rank, world = comm.get_rank(), comm.get_world_size()
    backend_name = comm.get_default_group().backend
    if cfg.algorithm in ("shm", "mpi") and world > 1 and backend_name != "mpi":
        raise UsageError(f"--algorithm {cfg.algorithm} needs the MPI transport (./mpirun.sh -n "
                         f"{world} python examples/train.py); this job runs {backend_name}: use "
                         "--algorithm auto, ring, tree, rd, hier or direct")
    nn.manual_seed(cfg.seed)                   # the same initial weights on every rank
    use_deterministic_algorithms(cfg.deterministic)  # --deterministic: any machine's bits
    kwargs = {} if cfg.dataset == "synthetic" else {"flatten": cfg.model == "mlp"}
    train_set = load_dataset(cfg.dataset, root=cfg.data_root, split="train", **kwargs)
    test_set = load_dataset(cfg.dataset, root=cfg.data_root, split="test", **kwargs)
    n_classes = int(max(train_set.y.max(), test_set.y.max())) + 1

    model = build_model(cfg.model, train_set.x.shape[1:], n_classes, cfg.dropout,
                        parse_widths(cfg.hidden), cfg.bn)
    optimizer = build_optimizer(cfg, model) if not cfg.zero else None
    if cfg.master_weights:  # converts the model to float16: before DDP builds its buckets
        optimizer = amp.MasterWeights(optimizer)
    ddp = DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_cap_mb,
                                  algorithm=cfg.algorithm)
    if cfg.zero:  # ZeRO shards DDP's buckets: built after them
        optimizer = build_optimizer(cfg, model, ddp)
    trainer = Trainer(ddp, nn.CrossEntropyLoss(), optimizer, TrainerConfig(
        epochs=cfg.epochs, batch_size=cfg.batch_size, seed=cfg.seed,
        grad_accum_steps=cfg.grad_accum_steps, lr_scaling=cfg.lr_scaling,
        warmup_epochs=cfg.warmup_epochs, schedule="cosine",
        checkpoint_dir=cfg.checkpoint_dir, checkpoint_keep_last=cfg.keep_last or None,
        resume="if_present" if cfg.resume_if_present and not cfg.resume else cfg.resume,
        stop_after_epochs=cfg.stop_after_epochs or None,
        checkpoint_every_n_epochs=cfg.checkpoint_every if cfg.checkpoint_dir else 0,
        progress_bar=cfg.progress_bar or None, amp=cfg.amp,
        allow_nonfinite=cfg.allow_nonfinite))
    if rank == 0:
        n_params = sum(p.data.size for p in model.parameters())
        print(f"{cfg.dataset}: {len(train_set)} train / {len(test_set)} test, model {cfg.model} "
              f"({n_params} params), {cfg.optimizer} lr {cfg.lr} x {cfg.lr_scaling} scaling, "
              f"batch {cfg.batch_size}/rank x {world} rank(s), buckets "
              f"{[round(b.nbytes / 2**20, 2) for b in ddp.buckets]} MiB", flush=True)
        if cfg.amp:
            print(f"amp: float16 autocast on {trainer.device_type}"
                  f"{' (emulated: float32 BLAS, rounded)' if trainer.device_type == 'cpu' else ''}"
                  f", loss scaling from {trainer.scaler.get_scale():g}"
                  f"{', float16 weights + float32 masters' if cfg.master_weights else ''}",
                  flush=True)
        if cfg.zero:  # what this rank keeps optimizer state for: its shard of every bucket
            owned = sum(p.data.size for g in optimizer.optim.param_groups for p in g["params"])
            print(f"zero: ZeRO-1 on, {cfg.optimizer} state sharded over {world} rank(s): rank 0 "
                  f"keeps it for {owned:,} of {n_params:,} elements", flush=True)

    if cfg.amp:
        check_float16_path(model, train_set.x[:2], trainer.device_type, cfg.model)
    start = time.perf_counter()
    history = trainer.fit(train_set, test_set)
    if history.train_losses and not math.isfinite(history.train_losses[-1]):
        if rank == 0:  # --allow-nonfinite trained on: say it once for the job
            print(f"train.py: the training loss is {history.train_losses[-1]}; the run "
                  f"diverged. Lower --lr (now {cfg.lr}).", file=sys.stderr, flush=True)
        raise SystemExit(1)
    acc = history.val_accuracies[-1] if history.val_accuracies else float("nan")
    if rank == 0:
        print(f"final test_acc {acc:.4f}  elapsed {time.perf_counter() - start:.2f}s  "
              f"world_size {world}  {history.samples_per_second:,.0f} samples/s"
              + (f"  amp scale {trainer.scaler.get_scale():g}, {trainer.scaler.skipped_steps} "
                 "skipped steps" if cfg.amp else ""), flush=True)
    if cfg.save_model:
        save_weights(model, cfg.save_model)
    ddp.close()
    comm.destroy_process_group()
    return acc


if __name__ == "__main__":
    # A user's mistake ends the job with one line (rank 0's), not a traceback per rank. Both
    # errors are raised alike on every rank: usage errors before any process group exists,
    # checkpoint errors after rank 0 decided for all.
    try:
        main()
    except (UsageError, CheckpointError, TrainingDiverged) as e:
        if job_rank() == 0:
            text = str(e)
            if isinstance(e, TrainingDiverged):  # said alike on every rank: rank 0's, once
                text = text.split("] ", 1)[-1].replace("TrainerConfig(allow_nonfinite=True)",
                                                       "--allow-nonfinite")
            print(f"train.py: {text}", file=sys.stderr, flush=True)
        raise SystemExit(2 if isinstance(e, UsageError) else 1) from None
