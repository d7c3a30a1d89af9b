"""One rank of a small DDP job for the attack test (tests/tcp/test_tcp_guard.py).

    RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GO_FILE=/tmp/go \
        python tests/tcp/attack_rank.py

After the process group is up it prints ``MESH UP`` and waits (at most 60 s) for ``GO_FILE`` to
exist, so the test can attack the running job; then 20 SGD steps of a DDP model on fixed data,
and rank 0 prints ``FINAL <loss as hex> <sum of the parameters as hex>``: bit-exact, to compare
with a clean run's.
"""

import os
import time

import numpy as np

import minidist as md
from minidist import nn, optim

md.init_process_group()
print("MESH UP", flush=True)
go, deadline = os.environ.get("GO_FILE"), time.monotonic() + 60
while go and not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
md.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
ddp = md.DistributedDataParallel(model)
opt = optim.SGD(model.parameters(), lr=0.1)
rng = np.random.default_rng(md.get_rank())
x, y = rng.normal(size=(32, 8)).astype(np.float32), rng.integers(0, 4, size=32)
for _ in range(20):
    opt.zero_grad()
    loss = nn.CrossEntropyLoss()(ddp(md.Tensor(x)), y)
    loss.backward()
    opt.step()
total = sum(float(p.detach().numpy().astype(np.float64).sum()) for p in model.parameters())
if md.get_rank() == 0:
    print(f"FINAL {float(loss.item()).hex()} {total.hex()}", flush=True)
md.destroy_process_group()
