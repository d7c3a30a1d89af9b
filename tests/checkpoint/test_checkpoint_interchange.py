"""Checkpoints that interchange with torch's habits: DDP's ``module.`` prefix, a custom
optimizer's Tensor state, ``map_location``'s dict, ``serialization.safe_globals`` and a saved
dataclass config; and with torch installed, a DDP checkpoint written by torch loads into
minidist's DDP and the reverse."""

import dataclasses
import io
import json
import pickle
import zipfile

import numpy as np
import pytest

import minidist
from minidist import nn, optim
from minidist import DistributedDataParallel as DDP


def lars_class(torch, base):
    """A LARS-style optimizer as a torch user writes it (Tensor state, in-place methods), for
    ``torch`` being either library."""

    class LARS(base):
        def __init__(self, params, lr=0.1, momentum=0.9, trust=0.02):
            super().__init__(params, dict(lr=lr, momentum=momentum, trust=trust))

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if "mu" not in state:
                        state["mu"] = torch.zeros_like(p)
                    ratio = group["trust"] * p.norm() / (p.grad.norm() + 1e-8)
                    mu = state["mu"]
                    mu.mul_(group["momentum"]).add_(p.grad * ratio)
                    p.add_(mu, alpha=-group["lr"])
    return LARS


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.norm(self.encoder(x)).relu())


KEYS = ["encoder.weight", "encoder.bias", "norm.weight", "norm.bias", "norm.running_mean",
        "norm.running_var", "norm.num_batches_tracked", "head.weight", "head.bias"]


def test_ddp_names_carry_torchs_module_prefix_and_load_either_form(group):
    minidist.manual_seed(0)
    ddp = DDP(Net())
    try:
        assert list(ddp.state_dict()) == ["module." + k for k in KEYS]
        assert list(ddp.module.state_dict()) == KEYS
        assert [n for n, _ in ddp.named_parameters()][:2] == ["module.encoder.weight",
                                                            "module.encoder.bias"]
        assert [n for n, _ in ddp.named_buffers()][0] == "module.norm.running_mean"
        assert [n for n, _ in ddp.named_modules()][:3] == ["", "module", "module.encoder"]
        assert all(p is q for (_, p), q in zip(ddp.named_parameters(), ddp.parameters()))
        saved = ddp.state_dict()
        with minidist.no_grad():
            for p in ddp.parameters():
                p.zero_()
        ddp.load_state_dict(saved)                               # torch's form: prefixed
        np.testing.assert_array_equal(ddp.module.head.weight.array, saved["module.head.weight"])
        bare = {k[len("module."):]: v * 2 for k, v in saved.items()}
        ddp.load_state_dict(bare)                                # the bare model's form
        np.testing.assert_array_equal(ddp.module.head.weight.array, bare["head.weight"])
        with pytest.raises(RuntimeError, match="consume_prefix_in_state_dict_if_present"):
            Net().load_state_dict(saved)                         # as torch: keys differ
        nn.modules.utils.consume_prefix_in_state_dict_if_present(saved, "module.")
        Net().load_state_dict(saved)
        wanted = {k for k, _ in ddp.named_parameters() if k.startswith("module.encoder.")}
        assert wanted == {"module.encoder.weight", "module.encoder.bias"}
    finally:
        ddp.close()


def test_a_custom_optimizers_tensor_state_saves_loads_and_steps_again(tmp_path):
    LARS = lars_class(minidist, optim.Optimizer)
    minidist.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = LARS(model.parameters())
    x = minidist.randn(5, 3)
    model(x).sum().backward()
    opt.step()
    state = opt.state_dict()
    mu = state["state"][0]["mu"]
    assert isinstance(mu, minidist.Tensor) and mu is not opt.state[model.weight]["mu"]
    minidist.save({"model": model.state_dict(), "opt": state}, tmp_path / "ckpt.pt")
    ckpt = minidist.load(tmp_path / "ckpt.pt")
    twin = nn.Linear(3, 2)
    twin.load_state_dict(ckpt["model"])
    opt2 = LARS(twin.parameters())
    opt2.load_state_dict(ckpt["opt"])                  # arrays in the file, Tensors back
    assert isinstance(opt2.state[twin.weight]["mu"], minidist.Tensor)
    np.testing.assert_array_equal(opt2.state[twin.weight]["mu"].array, mu.array)
    for m, o in ((model, opt), (twin, opt2)):         # the next step is the same on both
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    np.testing.assert_array_equal(twin.weight.array, model.weight.array)


def _mark_saved_on(path, key, device):
    """Rewrite ``path`` as if the array ``key`` had been saved from ``device`` (this machine
    may have no GPU to save one from)."""
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    arr = np.load(io.BytesIO(entries["__meta__.json.npy"]))
    meta = json.loads(arr.tobytes())
    meta["state"][key]["__device__"] = device
    out = io.BytesIO()
    np.save(out, np.frombuffer(json.dumps(meta).encode(), np.uint8))
    entries["__meta__.json.npy"] = out.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        for n, b in entries.items():
            z.writestr(n, b)


def test_map_location_dict_moves_only_what_was_saved_on_the_devices_it_names(tmp_path):
    path = tmp_path / "mixed.pt"
    minidist.save({"host": np.ones(3, np.float32), "gpu": np.zeros(3, np.float32)}, path)
    _mark_saved_on(path, "gpu", "cuda:0")
    for where in (None, "cpu", {"cuda:0": "cpu"}):         # nothing needs a device
        state = minidist.load(path, map_location=where)
        assert all(isinstance(v, np.ndarray) for v in state.values())
    if minidist.cuda.is_available():
        state = minidist.load(path, map_location={"cuda:1": "cuda:0"})
        assert state["gpu"].device == minidist.device("cuda:0") and isinstance(
            state["host"], np.ndarray)                       # the CPU's array stays there
    else:                                                    # as torch without a GPU: the
        state = minidist.load(path, map_location={"cuda:0": "cpu", "cuda:1": "cuda:0"})
        assert isinstance(state["gpu"], np.ndarray)          # dict sends it to the CPU
        with pytest.raises(minidist.DeviceUnavailableError,
                           match=r"saved on cuda:0 to cuda:0.*map_location='cpu'"):
            minidist.load(path, map_location={"cuda:1": "cpu"})   # it stays on cuda:0
        minidist.save(nn.Linear(2, 2), tmp_path / "m.pt")           # a pickle: the same rule
        with pytest.raises(minidist.DeviceUnavailableError, match="map_location='cpu'"):
            minidist.load(tmp_path / "m.pt", map_location="cuda:0", weights_only=False)
        assert minidist.load(tmp_path / "m.pt", map_location={"cuda:0": "cuda:1"},
                             weights_only=False).weight.device == minidist.device("cpu")


@dataclasses.dataclass
class Config:
    width: int = 16
    lr: float = 3e-4
    name: str = "vae"


def test_a_saved_dataclass_config_loads_with_weights_only_false_or_an_allow_list(tmp_path):
    model = nn.Linear(2, 2)
    minidist.save({"config": Config(width=8), "model": model.state_dict()}, tmp_path / "c.pt")
    with pytest.raises(pickle.UnpicklingError, match="Config.*weights_only=False.*safe_globals"):
        minidist.load(tmp_path / "c.pt")
    got = minidist.load(tmp_path / "c.pt", weights_only=False)
    assert got["config"] == Config(width=8)
    nn.Linear(2, 2).load_state_dict(got["model"])
    with minidist.serialization.safe_globals([Config]):
        assert minidist.load(tmp_path / "c.pt")["config"].width == 8
    assert Config not in minidist.serialization.get_safe_globals()
    with pytest.raises(pickle.UnpicklingError):
        minidist.load(tmp_path / "c.pt")                     # the context has ended


def test_allow_lists_name_layers_by_torchs_module_paths(tmp_path):
    import minidist.nn.modules.container
    import minidist.nn.modules.linear
    assert minidist.nn.modules.linear.Linear is nn.Linear
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    minidist.save(model, tmp_path / "m.pt")
    with pytest.raises(pickle.UnpicklingError, match="Sequential"):
        minidist.load(tmp_path / "m.pt")
    allowed = [nn.modules.container.Sequential, nn.modules.linear.Linear,
               nn.modules.activation.ReLU]
    minidist.serialization.add_safe_globals(allowed)
    try:
        loaded = minidist.load(tmp_path / "m.pt")
    finally:
        minidist.serialization.clear_safe_globals()
    np.testing.assert_array_equal(loaded[0].weight.array, model[0].weight.array)


@pytest.fixture
def torch_group(port):
    torch = pytest.importorskip("torch")
    import torch.distributed as tdist
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                             world_size=1)
    yield torch
    tdist.destroy_process_group()


def test_a_torch_ddp_checkpoint_loads_into_minidists_ddp_and_back(torch_group, group):
    """Keys, shapes and a custom optimizer's Tensor state, both ways (torch's file is read
    with torch.load and handed over as arrays, as a port does)."""
    torch = torch_group
    torch.manual_seed(0)
    # (a bias right before the norm would get a ~0 gradient, and LARS's ratio would blow up)
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.BatchNorm1d(3),
                               torch.nn.Linear(3, 2))
    tddp = torch.nn.parallel.DistributedDataParallel(tnet)
    topt = lars_class(torch, torch.optim.Optimizer)(tddp.parameters())
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 4)).astype(np.float32)
    w = rng.normal(size=(6, 2)).astype(np.float32)       # a loss whose gradient is not ~0
    (tddp(torch.from_numpy(x)) * torch.from_numpy(w)).sum().backward()
    topt.step()
    buf = io.BytesIO()
    torch.save({"model": tddp.state_dict(), "opt": topt.state_dict()}, buf)
    buf.seek(0)
    tck = torch.load(buf)
    as_np = {k: v.numpy() for k, v in tck["model"].items()}
    ostate = {"state": {i: {k: v.numpy() for k, v in s.items()}
                        for i, s in tck["opt"]["state"].items()},
              "param_groups": tck["opt"]["param_groups"]}

    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.BatchNorm1d(3), nn.Linear(3, 2))
    ddp = DDP(net)
    try:
        assert list(ddp.state_dict()) == list(tddp.state_dict())
        ddp.load_state_dict(as_np)
        opt = lars_class(minidist, optim.Optimizer)(ddp.parameters())
        opt.load_state_dict(ostate)
        for a, b in zip(ddp.parameters(), tddp.parameters()):
            np.testing.assert_array_equal(a.array, b.detach().numpy())
        for m, o in ((ddp, opt), (tddp, topt)):              # one more step on each
            o.zero_grad()
            lib = minidist if m is ddp else torch
            (m(lib.from_numpy(x)) * lib.from_numpy(w)).sum().backward()
            o.step()
        for a, b in zip(ddp.parameters(), tddp.parameters()):
            np.testing.assert_allclose(a.array, b.detach().numpy(), rtol=1e-5, atol=1e-6)
        back = {k: torch.from_numpy(np.array(v)) for k, v in ddp.state_dict().items()}
        tddp.load_state_dict(back)                           # and the reverse
        ost = opt.state_dict()
        topt.load_state_dict({"state": {i: {k: torch.from_numpy(np.array(v.array))
                                            for k, v in s.items()}
                                        for i, s in ost["state"].items()},
                              "param_groups": ost["param_groups"]})
        assert torch.equal(topt.state[tnet[0].weight]["mu"],
                           torch.from_numpy(opt.state[net[0].weight]["mu"].array))
    finally:
        ddp.close()
