"""A word-level LSTM language model trained under DDP, in the shape of PyTorch's
word_language_model example (the original; torch needed).

    torchrun --nproc_per_node 2 word_lm.py           # its minidist port: word_lm_minidist.py
"""
import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

TEXT = """the king is dead . long live the king . the queen is dead . long live the queen .
the king and the queen rode to the city . the people of the city saw the king .
the people of the city saw the queen . the king spoke to the people and the people listened .
the queen spoke to the king and the king listened . long live the people of the city .
the city is old and the king is old . the queen is young and the people are young .
the people rode to the king and spoke . the king rode to the queen and spoke ."""


class RNNModel(nn.Module):
    """Embedding, a 2-layer LSTM, and a decoder whose weight is the embedding's (tied)."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2, tie_weights=True):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        return (torch.zeros(self.nlayers, bsz, self.nhid),
                torch.zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    """Cut the token stream into bsz columns (the example's layout: (length, batch))."""
    nbatch = data.size(0) // bsz
    data = data[:nbatch * bsz]
    return data.view(bsz, -1).transpose(0, 1).contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


def repackage_hidden(h):
    """Cut the hidden state's history: backpropagation stops at the batch boundary."""
    if isinstance(h, tuple):
        return tuple(repackage_hidden(v) for v in h)
    return h.detach()


def main():
    dist.init_process_group(backend="gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(int(os.environ.get("SEED", "0")))
    words = TEXT.split()
    vocab = sorted(set(words))
    ids = torch.tensor([vocab.index(w) for w in words], dtype=torch.long)
    batch_size, bptt, clip, lr = 2, 8, 0.25, 0.01
    columns = batchify(ids, batch_size * world_size)            # one slice of columns per rank
    train_data = columns[:, rank * batch_size:(rank + 1) * batch_size]

    model = RNNModel(len(vocab), 32, 32, 2, dropout=0.2)
    model = DDP(model)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    epochs = int(os.environ.get("EPOCHS", "20"))
    for epoch in range(epochs):
        model.train()
        total_loss, batches = 0.0, 0
        hidden = model.module.init_hidden(batch_size)
        for i in range(0, train_data.size(0) - 1, bptt):
            data, targets = get_batch(train_data, i, bptt)
            hidden = repackage_hidden(hidden)
            optimizer.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            total_loss += loss.item()
            batches += 1
        mean_loss = torch.tensor([total_loss / batches])
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        mean_loss = mean_loss.item() / world_size
        if rank == 0:
            print(f"epoch {epoch}: loss {mean_loss:.4f} ppl {math.exp(mean_loss):.2f}", flush=True)
    if rank == 0:
        path = os.environ.get("SAVE_TO", "word_lm_model.pt")
        torch.save(model.module, path)
        loaded = torch.load(path, weights_only=False)
        loaded.eval()
        model.module.eval()
        data, targets = get_batch(train_data, 0, bptt)
        with torch.no_grad():
            a = criterion(model.module(data, model.module.init_hidden(batch_size))[0], targets)
            b = criterion(loaded(data, loaded.init_hidden(batch_size))[0], targets)
        print(f"reloaded model: same loss {a.item() == b.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
