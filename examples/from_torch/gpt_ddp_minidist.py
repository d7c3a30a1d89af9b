"""gpt_ddp.py ported to minidist: only the imports changed (see README.md).

    .venv/bin/python -m minidist.launch --standalone --nproc-per-node 2 examples/from_torch/gpt_ddp_minidist.py
"""
import argparse
import math
import os
from dataclasses import dataclass

import minidist as torch
import minidist as dist
import minidist.nn as nn
import minidist.nn.functional as F
from minidist import DistributedDataParallel as DDP
from minidist.data import DataLoader, TensorDataset
from minidist.data import DistributedSampler

TEXT = ("first citizen: before we proceed any further, hear me speak. all: speak, speak. "
        "first citizen: you are all resolved rather to die than to famish? all: resolved. "
        "resolved. first citizen: first, you know caius marcius is chief enemy to the people. ")


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 16
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    embd_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    attn_pdrop: float = 0.1


class MultiheadAttentionLayer(nn.Module):
    """Causal self-attention: torch's MultiheadAttention, then a projection."""

    def __init__(self, config):
        super().__init__()
        self.attn = nn.MultiheadAttention(config.n_embd, config.n_head, dropout=config.attn_pdrop,
                                          batch_first=True)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_drop = nn.Dropout(config.resid_pdrop)

    def forward(self, x):
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t), diagonal=1).bool()  # True: may not attend
        y = self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]
        return self.resid_drop(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.attn = MultiheadAttentionLayer(config)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
            nn.Dropout(config.resid_pdrop),
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.block_size = config.block_size
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, config.block_size, config.n_embd))
        self.drop = nn.Dropout(config.embd_pdrop)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        x = self.drop(self.tok_emb(idx) + self.pos_emb[:, :t, :])
        logits = self.head(self.ln_f(self.blocks(x)))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss


def create_optimizer(model, weight_decay=0.1, lr=3e-3):
    """AdamW with weight decay on the Linear and attention projection weights only."""
    decay, no_decay = set(), set()
    for mn, m in model.named_modules():
        for pn, p in m.named_parameters():
            fpn = f"{mn}.{pn}" if mn else pn
            if pn.endswith("bias"):
                no_decay.add(fpn)
            elif pn.endswith("in_proj_weight") or (pn.endswith("weight")
                                                   and isinstance(m, nn.Linear)):
                decay.add(fpn)
            elif pn.endswith("weight") or pn.endswith("pos_emb"):
                no_decay.add(fpn)
    params = dict(model.named_parameters())
    groups = [{"params": [params[n] for n in sorted(decay - no_decay)],
               "weight_decay": weight_decay},
              {"params": [params[n] for n in sorted(no_decay)], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, do_sample=False, top_k=None):
    """minGPT's sampling loop: crop the context, keep the top k logits, sample, append."""
    for _ in range(max_new_tokens):
        idx_cond = idx if idx.size(1) <= model.block_size else idx[:, -model.block_size:]
        logits, _ = model(idx_cond)
        logits = logits[:, -1, :] / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, top_k)
            logits[logits < v[:, [-1]]] = -float("Inf")
        probs = F.softmax(logits, dim=-1)
        if do_sample:
            idx_next = torch.multinomial(probs, num_samples=1)
        else:
            _, idx_next = torch.topk(probs, k=1, dim=-1)
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def main():
    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = [stoi[c] for c in TEXT]
    config = GPTConfig(vocab_size=len(chars))
    starts = range(0, len(data) - config.block_size - 1, 3)
    x = torch.tensor([data[i:i + config.block_size] for i in starts], dtype=torch.long)
    y = torch.tensor([data[i + 1:i + config.block_size + 1] for i in starts], dtype=torch.long)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = GPT(config)
    optimizer = create_optimizer(model)
    model = DDP(model)
    steps = int(os.environ.get("STEPS", "40"))
    step = 0
    for epoch in range(steps):
        sampler.set_epoch(epoch)
        for source, targets in loader:
            _, loss = model(source, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            mean_loss = torch.tensor([loss.item()])
            dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
            if rank == 0 and step % 10 == 0:
                print(f"step {step}: loss {mean_loss.item() / world_size:.4f}", flush=True)
            step += 1
            if step == steps:
                break
        if step == steps:
            break
    if rank == 0:
        print(f"step {step}: loss {mean_loss.item() / world_size:.4f}", flush=True)
        model.module.eval()
        context = torch.tensor([[stoi[c] for c in "first "]], dtype=torch.long)
        out = generate(model.module, context, 24, do_sample=True, top_k=5)
        print("sample: " + "".join(chars[i] for i in out[0].tolist()), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
