"""A tiny nanoGPT-style character model trained with a LARS optimizer under DDP (the original;
torch needed).

    torchrun --standalone --nproc_per_node 2 nanogpt_lars.py   # port: nanogpt_lars_minidist.py
"""
import math
import os
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

# -----------------------------------------------------------------------------
# config: plain globals, as nanoGPT's train.py
eval_interval = 10
eval_iters = 4
batch_size = 8  # sequences per rank per step
block_size = 32  # context length
n_layer = 2
n_head = 2
n_embd = 48
dropout = 0.0
bias = True  # biases in Linears and LayerNorms
learning_rate = 1.0  # the schedule's peak, scaled per parameter group below
learning_rate_weights = 40.0  # LARS scales it by eta * |w| / |grad| per tensor
learning_rate_biases = 0.05  # biases and norms: plain momentum SGD
weight_decay = 1e-4
momentum = 0.9
max_iters = int(os.environ.get("STEPS", 60))
warmup_iters = 5
min_lr = 0.1
grad_clip = 1.0  # clip gradients at this value, or disable if == 0.0
dtype = os.environ.get("DTYPE", "float32")  # 'float32', 'bfloat16', or 'float16'
device = "cpu"
# -----------------------------------------------------------------------------

TEXT = ("first citizen: before we proceed any further, hear me speak. all: speak, speak. "
        "first citizen: you are all resolved rather to die than to famish? all: resolved. "
        "resolved. first citizen: first, you know caius marcius is chief enemy to the people. "
        "all: we know't, we know't. first citizen: let us kill him, and we'll have corn at our "
        "own price. is't a verdict? all: no more talking on't; let it be done: away, away! ")


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias (nanoGPT's model.py)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):

    def __init__(self):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # key, query, value at once
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention()
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, vocab_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block() for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias=bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # scaled init of the residual projections
            if pn.endswith("c_proj.weight"):
                p.data.normal_(mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):  # minGPT's init, through .data
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=0.02)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=0.02)
        elif isinstance(module, LayerNorm):
            module.weight.data.fill_(1.0)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


class LARS(torch.optim.Optimizer):
    """LARS as Barlow Twins writes it: weight decay, a trust ratio per tensor, momentum."""

    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001,
                 weight_decay_filter=None, lars_adaptation_filter=None):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta,
                        weight_decay_filter=weight_decay_filter,
                        lars_adaptation_filter=lars_adaptation_filter)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                dp = p.grad
                if dp is None:
                    continue
                if g["weight_decay_filter"] is None or not g["weight_decay_filter"](p):
                    dp = dp.add(p, alpha=g["weight_decay"])
                if g["lars_adaptation_filter"] is None or not g["lars_adaptation_filter"](p):
                    param_norm = torch.norm(p)
                    update_norm = torch.norm(dp)
                    one = torch.ones_like(param_norm)
                    q = torch.where(param_norm > 0.,
                                    torch.where(update_norm > 0,
                                                (g["eta"] * param_norm / update_norm), one), one)
                    dp = dp.mul(q)
                param_state = self.state[p]
                if "mu" not in param_state:
                    param_state["mu"] = torch.zeros_like(p)
                mu = param_state["mu"]
                mu.mul_(g["momentum"]).add_(dp)
                p.add_(mu, alpha=-g["lr"])


def exclude_bias_and_norm(p):
    return p.ndim == 1


# -----------------------------------------------------------------------------
# DDP setup, as nanoGPT's train.py
ddp = int(os.environ.get("RANK", -1)) != -1  # is this a ddp run?
if ddp:
    init_process_group(backend="gloo")
    ddp_rank = int(os.environ["RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank  # each process gets a different seed
else:
    master_process, seed_offset, ddp_world_size = True, 0, 1
torch.manual_seed(1337 + seed_offset)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if dtype == "float32" else torch.amp.autocast(device_type=device_type,
                                                                   dtype=ptdtype)

# data: the characters as a uint16 array, 90% train, 10% val
chars = sorted(set(TEXT))
stoi = {ch: i for i, ch in enumerate(chars)}
encoded = np.array([stoi[c] for c in TEXT], dtype=np.uint16)
n = int(0.9 * len(encoded))
train_data, val_data = encoded[:n], encoded[n:]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy((data[i:i + block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + block_size]).astype(np.int64))
                     for i in ix])
    return x.to(device), y.to(device)


model = GPT(len(chars))
model.to(device)
param_weights = [p for p in model.parameters() if p.ndim != 1]
param_biases = [p for p in model.parameters() if p.ndim == 1]
optimizer = LARS([{"params": param_weights}, {"params": param_biases}], lr=0,
                 weight_decay=weight_decay, momentum=momentum,
                 weight_decay_filter=exclude_bias_and_norm,
                 lars_adaptation_filter=exclude_bias_and_norm)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model  # unwrap DDP container if needed


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    """Linear warmup, then cosine decay down to min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    decay_ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# -----------------------------------------------------------------------------
# training loop
X, Y = get_batch("train")
t0 = time.time()
for iter_num in range(max_iters + 1):
    lr = get_lr(iter_num)
    optimizer.param_groups[0]["lr"] = lr * learning_rate_weights  # as Barlow Twins does
    optimizer.param_groups[1]["lr"] = lr * learning_rate_biases
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if iter_num == max_iters:
        break
    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch("train")  # prefetch the next batch
    scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
if master_process:
    print(f"done: {max_iters} steps on {ddp_world_size} rank(s) in {time.time() - t0:.1f}s")
if ddp:
    destroy_process_group()
