"""torch's namespaces by their paths (torch.distributed and its sub-packages, torch.backends,
torch.cuda.amp, torch.nn.parallel, torch.multiprocessing, torch.utils.checkpoint), and the
guides' mixed-precision + PowerSGD snippet run under the launcher at n=2 with its import lines
mapped to minidist's."""

import importlib

import numpy as np
import pytest

import minidist
from procs import run_python

# torch's import line -> minidist's (the mapping docs/porting.md gives)
IMPORT_MAP = {
    "from torch.cuda.amp import autocast, GradScaler":
        "from minidist.cuda.amp import autocast, GradScaler",
    "from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook":
        "from minidist.distributed.algorithms.ddp_comm_hooks import powerSGD_hook",
    "import torch": "import minidist as torch",
    "import torch.distributed as dist": "import minidist.distributed as dist",
    "from torch.nn.parallel import DistributedDataParallel as DDP":
        "from minidist.nn.parallel import DistributedDataParallel as DDP",
}

# The guide's "Mixed Precision + Gradient Compression" section, verbatim.
SNIPPET = '''\
from torch.cuda.amp import autocast, GradScaler

def train_optimized(rank, world_size, config):
    setup(rank, world_size)
    
    model = get_model('vae')(config).to(rank)
    model = DDP(model, device_ids=[rank])
    
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    scaler = GradScaler()  # For mixed precision
    
    # Enable gradient compression (PowerSGD)
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=1
    )
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    
    for epoch in range(50):
        for batch in train_loader:
            optimizer.zero_grad()
            
            # Mixed precision forward
            with autocast():
                output = model(batch)
                loss = output['loss']
            
            # Scaled backward
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
    
    cleanup()
'''

# The snippet puts the model on GPU `rank` (as torch, it cannot run on a CPU-only machine);
# without a GPU these two lines get the CPU spelling, and nothing else changes.
CPU_LINES = {
    "model = get_model('vae')(config).to(rank)": "model = get_model('vae')(config).to('cpu')",
    "model = DDP(model, device_ids=[rank])": "model = DDP(model, device_ids=None)",
}

# What the guide defines around the snippet (its earlier sections), small and on the CPU.
HARNESS = '''\
import os
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    dist.init_process_group(backend="gloo", init_method="env://")


def cleanup():
    dist.destroy_process_group()


class VAE(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        torch.manual_seed(0)
        self.enc = torch.nn.Linear(config["dim"], 2 * config["latent"])
        self.dec = torch.nn.Linear(config["latent"], config["dim"])

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=1)
        z = mu + (0.5 * logvar).exp() * torch.randn_like(mu)
        recon = ((self.dec(z) - x) ** 2).sum(1).mean()
        kl = (-0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1)).mean()
        return {"loss": recon + kl}


def get_model(name):
    assert name == "vae"
    return VAE


rank = int(os.environ["RANK"])
rng = np.random.default_rng(rank)
train_loader = [torch.tensor(rng.normal(size=(8, 16)), dtype=torch.float32) for _ in range(4)]
config = {"dim": 16, "latent": 4}
'''

FOOTER = '''
train_optimized(rank, int(os.environ["WORLD_SIZE"]), config)
print(f"rank {rank} done")
'''


def port(source, cpu):
    out = []
    for line in source.splitlines():
        stripped = line.strip()
        indent = line[:len(line) - len(line.lstrip())]
        if stripped in IMPORT_MAP:
            out.append(indent + IMPORT_MAP[stripped])
        elif cpu and stripped in CPU_LINES:
            out.append(indent + CPU_LINES[stripped])
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def test_the_guides_amp_powersgd_snippet_runs_under_the_launcher(tmp_path):
    cpu = not minidist.cuda.is_available()
    ported = port(SNIPPET, cpu)
    changed = [(a, b) for a, b in zip(SNIPPET.splitlines(), ported.splitlines()) if a != b]
    allowed = set(IMPORT_MAP) | (set(CPU_LINES) if cpu else set())
    assert changed and all(a.strip() in allowed for a, _ in changed), changed
    script = tmp_path / "train_distributed.py"
    script.write_text(port(HARNESS, cpu) + "\n" + ported + FOOTER)
    job = run_python(["-m", "minidist.launch", "--standalone", "--nproc-per-node", "2", script],
                     timeout_s=240)
    assert job.returncode == 0, job.report()
    assert "rank 0 done" in job.stdout and "rank 1 done" in job.stdout, job.report()


def test_torch_module_paths_import():
    from minidist.cuda.amp import GradScaler, autocast
    from minidist.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from minidist.distributed.optim import ZeroRedundancyOptimizer
    from minidist.nn.parallel import DistributedDataParallel
    from minidist.utils.checkpoint import checkpoint, checkpoint_sequential

    assert DistributedDataParallel is minidist.DistributedDataParallel
    assert ZeroRedundancyOptimizer is minidist.ZeroRedundancyOptimizer
    assert powerSGD_hook.powerSGD_hook is minidist.ddp.powersgd_hook
    assert default_hooks.fp16_compress_hook is minidist.ddp.fp16_compress_hook
    assert default_hooks.allreduce_hook is minidist.ddp.allreduce_hook
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1)
    assert state.matrix_approximation_rank == 1 and state.start_powerSGD_iter == 1000
    assert minidist.multiprocessing.spawn is importlib.import_module(
        "minidist.multiprocessing").spawn
    assert issubclass(GradScaler, minidist.amp.GradScaler)
    assert autocast().device_type == "cuda"
    assert minidist.cuda.amp.GradScaler is GradScaler
    assert callable(checkpoint) and callable(checkpoint_sequential)
    # both spellings of checkpoint call the same function
    from minidist.utils import checkpoint as module_or_function
    lin = minidist.nn.Linear(3, 3)
    x = minidist.randn(2, 3, requires_grad=True)
    np.testing.assert_array_equal(module_or_function(lin, x).data, checkpoint(lin, x).data)
    import minidist.utils.checkpoint as cp
    assert cp.checkpoint is checkpoint


def test_backends_flags_are_accepted_and_readable():
    import minidist.backends.cudnn as cudnn

    minidist.backends.cuda.matmul.allow_tf32 = True
    minidist.backends.cudnn.allow_tf32 = True
    cudnn.benchmark = True
    assert minidist.backends.cudnn.benchmark is True and minidist.backends.cuda.matmul.allow_tf32
    assert cudnn.is_available() is False and minidist.backends.mps.is_available() is False
    cudnn.benchmark = False


def test_cuda_amp_without_a_gpu_behaves_as_torchs():
    if minidist.cuda.is_available():
        pytest.skip("the no-GPU behaviour")
    from minidist.cuda.amp import GradScaler, autocast

    scaler = GradScaler()
    assert scaler.is_enabled() is False                       # torch warns and disables
    lin = minidist.nn.Linear(4, 4)
    with autocast():
        y = lin(minidist.randn(2, 4))
    assert y.dtype == np.float32                              # CPU ops are left alone
    loss = y.sum()
    assert scaler.scale(loss) is loss


def test_distributed_package_has_torchs_collective_signatures(group):
    import minidist.distributed as dist

    t = minidist.ones(3)
    assert dist.all_reduce(t, dist.ReduceOp.SUM, None) is None       # torch's third: group
    np.testing.assert_array_equal(t.data, 1.0)
    out = [minidist.zeros(3)]
    dist.all_gather(out, minidist.full((3,), 2.0))
    np.testing.assert_array_equal(out[0].data, 2.0)
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    assert objs == [{"a": 1}]
    assert dist.get_rank() == 0 and dist.get_world_size() == 1 and dist.is_initialized()
    assert dist.is_available() and dist.is_gloo_available() and not dist.is_nccl_available()
    assert dist.get_backend() == minidist.get_backend()
    with pytest.raises(ValueError, match="tensor_list"):
        dist.all_gather([], t)
