"""ZeRO-1 without DDP's buckets: whole parameters partitioned between the ranks (torch's way).

Sorted by size, each parameter goes to the rank with the fewest elements so far; that rank
keeps its optimizer state, steps it and broadcasts it (one flat message per rank and dtype).
``minidist.memory.zero.ZeroRedundancyOptimizer`` uses ``Partition`` when built without
``ddp=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minidist import comm
from minidist import xp as backend

if TYPE_CHECKING:
    from minidist.memory.zero import ZeroRedundancyOptimizer


class Partition:
    """The path without buckets: whole parameters partitioned between the ranks (torch's way).

    ``owner[i]`` is the rank that steps parameter ``i`` (its index in the outer optimizer);
    the inner optimizer holds this rank's parameters only, in the outer groups' structure
    (group k inside = group k outside, with only the parameters this rank owns).
    """

    def __init__(self, outer: ZeroRedundancyOptimizer, optimizer_class: type,
                 defaults: dict[str, Any]) -> None:
        self.outer = outer
        params = [p for _, p, _ in outer.indexed_params()]
        sizes = [0] * outer.world_size
        self.owner = [0] * len(params)
        index = {id(p): i for i, p, _ in outer.indexed_params()}
        for group in outer.param_groups:  # torch's _partition_parameters: greedy by size
            for p in sorted(group["params"], key=lambda t: t.array.size, reverse=True):
                r = sizes.index(min(sizes))
                self.owner[index[id(p)]] = r
                sizes[r] += int(p.array.size)
        self.mine = [i for i, r in enumerate(self.owner) if r == outer.rank]
        groups = []
        for group in outer.param_groups:
            opts = {k: v for k, v in group.items() if k != "params"}
            groups.append({**opts, "params": [p for p in group["params"]
                                              if self.owner[index[id(p)]] == outer.rank]})
        self.optim = optimizer_class(groups, **defaults)
        self.inner_index = {i: k for k, i in enumerate(self.mine)}  # outer -> inner index
        # per rank, per dtype: (flat buffer, its parameters); one broadcast each per step
        self.plan: list[tuple[int, Any, list[Any]]] = []
        for r in range(outer.world_size):
            by_dtype: dict[Any, list[Any]] = {}
            for i, p in enumerate(params):
                if self.owner[i] == r:
                    by_dtype.setdefault((p.array.dtype, backend.get_array_module(p.array)),
                                        []).append(p)
            for (dtype, xp), ps in by_dtype.items():
                self.plan.append((r, xp.empty(sum(p.array.size for p in ps), dtype), ps))

    def nbytes(self) -> int:
        return sum(int(flat.nbytes) for _, flat, _ in self.plan)

    def step(self) -> None:
        """Step this rank's parameters, then every rank's go out from their owner."""
        outer = self.outer
        for inner_group, group in zip(self.optim.param_groups, outer.param_groups):
            inner_group.update({k: v for k, v in group.items() if k != "params"})
        self.optim.step()
        if outer.world_size == 1:
            return
        for r, flat, ps in self.plan:
            at = 0
            if r == outer.rank:
                for p in ps:
                    flat[at:at + p.array.size] = p.array.reshape(-1)
                    at += p.array.size
            comm.broadcast(flat, src=r, group=outer.process_group)
            if r != outer.rank:
                for p in ps:
                    p.array[...] = flat[at:at + p.array.size].reshape(p.array.shape)
                    at += p.array.size

    def gather_state(self) -> dict[str, Any]:
        """Every parameter's state from its owner (COLLECTIVE), in torch's layout."""
        outer = self.outer
        mine = {i: self.optim.state.get(k, {}) for i, k in self.inner_index.items()}
        state: dict[int, dict[str, Any]] = {}
        params = [p for _, p, _ in outer.indexed_params()]
        for r in range(outer.world_size):
            meta = {str(i): {key: (["array", str(v.dtype)] if hasattr(v, "shape") and
                                   getattr(v, "ndim", 0) > 0 else ["value", v])
                             for key, v in s.items()}
                    for i, s in mine.items() if s} if r == outer.rank else None
            if outer.world_size > 1:
                meta = comm.broadcast_object(meta, src=r, group=outer.process_group)
            meta = meta or {}
            for key_i in sorted(meta, key=int):  # one order on every rank (JSON may sort)
                i, entries = int(key_i), meta[key_i]
                full: dict[str, Any] = {}
                for key in sorted(entries):
                    kind, v = entries[key]
                    if kind == "value":
                        full[key] = v
                        continue
                    xp = backend.get_array_module(params[i].array)
                    arr = mine[i][key].copy() if r == outer.rank else \
                        xp.empty(params[i].array.shape, dtype=v)
                    if outer.world_size > 1:
                        comm.broadcast(arr, src=r, group=outer.process_group)
                    full[key] = arr
                state[i] = full
        groups, start = [], 0
        for group in outer.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(g)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state(self, name: str, state_dict: dict[str, Any]) -> None:
        """Keep this rank's entries of a whole state dict; checked as the inner class does."""
        outer = self.outer
        groups = state_dict.get("param_groups", [])
        sizes = [len(g["params"]) for g in outer.param_groups]
        if [len(g.get("params", [])) for g in groups] != sizes:
            raise ValueError(f"{name}: the checkpoint has groups of "
                             f"{[len(g.get('params', [])) for g in groups]} parameters; this "
                             f"optimizer has {sizes}. Build the same model and groups.")
        saved = {int(k): v for k, v in state_dict.get("state", {}).items()}
        inner_groups = []
        for saved_group, group, inner in zip(groups, outer.param_groups,
                                             self.optim.param_groups):
            opts = {k: (tuple(v) if isinstance(v, list) else v)
                    for k, v in saved_group.items() if k != "params"}
            group.update(opts)
            inner_groups.append({**opts, "params": list(range(len(inner["params"])))})
        k0, numbered = 0, []
        for inner in inner_groups:  # renumber the inner groups' parameters consecutively
            numbered.append({**inner, "params": [k0 + j for j in inner["params"]]})
            k0 += len(inner["params"])
        inner_state = {self.inner_index[i]: s for i, s in saved.items() if i in self.inner_index}
        bad = [i for i in saved if not 0 <= i < len(self.owner)]
        if bad:
            raise ValueError(f"{name}: state for parameters {bad[:4]}, outside 0.."
                             f"{len(self.owner) - 1}. The checkpoint belongs to another model.")
        self.optim.load_state_dict({"state": inner_state, "param_groups": numbered})
