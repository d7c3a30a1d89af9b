"""Scale model: all-reduce and DDP step time from 2 to 4096 ranks, fitted to measured results.

    .venv/bin/python benchmarks/scale_model.py --quick        # fit + validate + a small grid
    .venv/bin/python benchmarks/scale_model.py                # the full grid, tables + JSON
    .venv/bin/python benchmarks/scale_model.py --out benchmarks/results --plots docs/img
    .venv/bin/python benchmarks/scale_model.py --links 100:5 --ranks-per-node 8 \\
        --model 25M:100 --overlap 0.8                         # one cluster, one model

No processes are started: the script reads the all-reduce benchmark's JSON results
(``benchmarks/allreduce.py``, one file per run; by default the ones shipped in
``benchmarks/results/``, measured on the machine docs/benchmarks.md describes: pass
``--inputs`` with your own runs' JSON to fit YOUR machine) and fits, per LEVEL of the machine,
the alpha-beta-gamma constants that every algorithm shares:

  alpha  microseconds per message (latency + the per-message software cost)
  beta   microseconds per byte sent
  gamma  microseconds per byte reduced (a NumPy add; read from the all-reduce fit, which
         measures it, or re-measured with --measure-gamma)

Levels: ``mpi`` (the MPI transport on one node: shared memory) is the intra-node level; the
network path is ``tcp`` (the TCP transport over loopback: the only network this machine has,
so a stand-in for a NIC). A two-level machine of N nodes of k ranks (p = N k, consecutive ranks
on a node):

    node 0                node 1                         node N-1
  +------------------+  +------------------+          +------------------+
  | r0  r1 ... rk-1  |  | rk ...    r2k-1  |   ...    |     ...    rp-1  |
  +--------+---------+  +--------+---------+          +--------+---------+
    intra: |  alpha_i, beta_i     |                            |
           +===== inter: alpha_e, beta_e (per NIC, shared by its flows) =====+

Every algorithm is costed round by round: a round costs its slowest message (an intra-node
message alpha_i + m beta_i, a message leaving a node alpha_e + f m beta_e where f messages
leave that node at once and share its NIC), plus m gamma when the round reduces.
``hier`` = intra reduce-scatter (ring, k ranks), inter all-reduce of each K/k shard across
the N nodes (ring or recursive doubling: the cheaper, or with --hier-rule implemented what
minidist's hier runs; the k shards cross at once, f = k), intra all-gather. On one node every
formula reduces to the one-node formulas of docs/algorithms.md (tested against hand-computed
values).

Validation: every fitted point predicted beside its measurement (error in %), each world size
held out and predicted from the others, the DDP step against benchmarks/ddp_scaling.py's
JSON, and ``hier`` on virtual nodes from ``*hier*.json`` results (benchmarks/hier.py): with the
fitted constants, with constants fitted on the flat ring of the same run (the machine's load
when that file was written), and as the ratio hier / ring measured side by side.

The fit (weighted least squares on relative error, the formulas are linear in alpha, beta,
gamma) corrects for oversubscription: with n ranks on c cores every rank runs n/c times
slower (factor max(1, n/c)), which is what n=3, 4 on a 2-core machine measure. The DDP step:
compute time T (given), buckets of 1 MiB then 25 MiB, each all-reduced with the fastest
algorithm; the communication overlaps the backward pass (2/3 of T) by the fraction
``--overlap``, except the last bucket, which starts when backward ends:

    step = T + max(C - overlap * 2T/3, min(C, C_last))      efficiency = T / step

Writes ``scale_model.json`` to --out (default runs/bench/) and, with --plots DIR,
``scaling_*.png`` there (needs matplotlib). docs/scaling.md explains the output.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from _common import (LOCAL_RESULTS, REPO, Table, human, machine_info, parse_bytes, shown,
                     write_json)

FLAT = ("ring", "tree", "rd")
ALGORITHMS = (*FLAT, "hier")
DEFAULT_INPUTS = ["benchmarks/results/allreduce_n*.json", "benchmarks/results/scale_tcp_n*.json"]
DEFAULT_HIER = ["benchmarks/results/*hier*.json"]
GAMMA_SOURCE = "benchmarks/results/allreduce_fit.json"
FIRST_BUCKET = 1 << 20   # DDP's first bucket (torch and minidist: 1 MiB)
BUCKET = 25 << 20        # the others (25 MiB)
BACKWARD_SHARE = 2 / 3   # backward's share of the compute time (stated assumption)
try:  # hier's inter-node phase: recursive doubling below this shard size, ring above
    from minidist.fastpath.hier import RD_MAX_BYTES as HIER_RD_MAX_BYTES
except ImportError:  # a minidist without hier: its documented threshold
    HIER_RD_MAX_BYTES = 64 << 10


# ---------------------------------------------------------------- levels and links

@dataclass(frozen=True)
class Level:
    """alpha-beta-gamma constants of one level (microseconds, per message / byte)."""

    name: str
    alpha_us: float
    beta_us_per_byte: float
    gamma_us_per_byte: float

    def scaled(self, flows: float) -> "Level":
        """The level as seen by one of ``flows`` messages sharing its bandwidth."""
        return Level(self.name, self.alpha_us, self.beta_us_per_byte * flows,
                     self.gamma_us_per_byte)


def link_level(gbps: float, latency_us: float, software_alpha_us: float, gamma: float) -> Level:
    """A network link: alpha = wire latency + per-message software cost, beta = 1/bandwidth
    (1 Gb/s = 125 bytes/us), no per-byte software cost (a zero-copy, RDMA-class NIC)."""
    return Level(f"{gbps:g}Gb/s", latency_us + software_alpha_us, 1.0 / (125.0 * gbps), gamma)


def parse_link(text: str) -> tuple[float, float]:
    """``"100:5"`` -> (100 Gb/s, 5 us latency)."""
    try:
        gbps, lat = (float(x) for x in text.split(":"))
    except ValueError:
        raise SystemExit(f"--links: cannot read {text!r}; write GBPS:LATENCY_US, e.g. 100:5") \
            from None
    if gbps <= 0 or lat < 0:
        raise SystemExit(f"--links: {text!r} needs a positive bandwidth and latency >= 0")
    return gbps, lat


def parse_model(text: str) -> tuple[float, float]:
    """``"25M:100"`` -> (25e6 parameters, 100 ms compute per step)."""
    try:
        params, ms = text.split(":")
        count = float(params[:-1]) * {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}[params[-1].upper()] \
            if params[-1].isalpha() else float(params)
        return count, float(ms)
    except (ValueError, KeyError):
        raise SystemExit(f"--model: cannot read {text!r}; write PARAMS:COMPUTE_MS, e.g. 25M:100") \
            from None


# ---------------------------------------------------------------- cost, round by round

@dataclass(frozen=True)
class Round:
    """One round of concurrent messages: each ``share`` x K bytes; ``intra``: some message
    stays in a node; ``flows``: most messages leaving one node (0: none leaves)."""

    share: float
    reduce: bool
    intra: bool
    flows: int
    repeat: int = 1


def _round(pairs: list[tuple[int, int]], k: int, share: float, reduce: bool,
           repeat: int = 1) -> Round:
    out: Counter = Counter()
    inside = False
    for src, dst in pairs:
        if src // k != dst // k:
            out[src // k] += 1
        else:
            inside = True
    return Round(share, reduce, inside, max(out.values(), default=0), repeat)


@lru_cache(maxsize=4096)
def schedule(algorithm: str, p: int, k: int, halving: bool = False) -> tuple[Round, ...]:
    """The rounds of a flat algorithm on p ranks, k consecutive ranks per node, as implemented
    in minidist.comm.algorithms (ring, binomial tree, recursive doubling / Rabenseifner)."""
    if p < 2:
        return ()
    if algorithm == "ring":
        pairs = [(r, (r + 1) % p) for r in range(p)]
        return (_round(pairs, k, 1 / p, True, p - 1), _round(pairs, k, 1 / p, False, p - 1))
    if algorithm == "tree":
        rounds, mask = [], 1
        while mask < p:
            pairs = [(v, v - mask) for v in range(p) if v & mask and v % (2 * mask) == mask]
            rounds.append(_round(pairs, k, 1.0, True))
            mask <<= 1
        return tuple(rounds) + tuple(Round(r.share, False, r.intra, r.flows) for r in rounds[::-1])
    if algorithm == "rd":
        q = 1 << (p.bit_length() - 1)
        rem = p - q

        def real(u: int) -> int:
            return 2 * u + 1 if u < rem else u + rem

        fold = [(2 * i, 2 * i + 1) for i in range(rem)]
        rounds = [_round(fold, k, 1.0, True)] if rem else []
        masks = [q >> i for i in range(1, q.bit_length())] if halving else \
            [1 << i for i in range(q.bit_length() - 1)]
        steps = []
        for i, mask in enumerate(masks):
            pairs = [(real(v), real(v ^ mask)) for v in range(q)]
            steps.append(_round(pairs, k, 0.5 ** (i + 1) if halving else 1.0, True))
        rounds += steps
        if halving:
            rounds += [Round(r.share, False, r.intra, r.flows) for r in steps[::-1]]
        if rem:
            rounds.append(Round(1.0, False, rounds[0].intra, rounds[0].flows))
        return tuple(rounds)
    raise ValueError(f"schedule: unknown algorithm {algorithm!r}; use one of {FLAT}")


def _uses_halving(nbytes: float, p: int) -> bool:
    from minidist.comm.algorithms.recursive_doubling import uses_halving

    return uses_halving(int(nbytes), int(nbytes), p)  # as select.COST calls it


def flat_time(algorithm: str, p: int, nbytes: float, intra: Level, inter: Level | None = None,
              k: int | None = None, nic_shared: bool = True) -> float:
    """Microseconds of one flat all-reduce of ``nbytes`` on p ranks, k per node (default: one
    node, every message intra). ``nic_shared=False``: messages leaving a node at once do not
    share a bandwidth (virtual nodes on one machine have no NIC)."""
    k = p if k is None else k
    inter = inter or intra
    halving = algorithm == "rd" and _uses_halving(nbytes, p)
    total = 0.0
    for r in schedule(algorithm, p, k, halving):
        m = r.share * nbytes
        t = intra.alpha_us + m * intra.beta_us_per_byte if r.intra else 0.0
        if r.flows:
            flows = r.flows if nic_shared else 1
            t = max(t, inter.alpha_us + flows * m * inter.beta_us_per_byte)
        total += r.repeat * (t + (m * intra.gamma_us_per_byte if r.reduce else 0.0))
    return total


def hier_time(p: int, k: int, nbytes: float, intra: Level, inter: Level,
              nic_shared: bool = True, rule: str = "best") -> tuple[float, str]:
    """(microseconds, inter-node algorithm) of ``hier``: intra ring reduce-scatter, inter
    all-reduce of each K/k shard across N = p/k nodes (k shards share each NIC unless
    ``nic_shared`` is False), intra all-gather. ``p`` must be a multiple of ``k``. ``rule``:
    "best" takes the cheaper of ring and rd across nodes, "implemented" what minidist's hier
    does (rd for shards below ``HIER_RD_MAX_BYTES``, else ring)."""
    if p % k:
        raise ValueError(f"hier_time: p={p} is not a multiple of k={k} ranks per node")
    nodes, shard = p // k, nbytes / k
    a, b, g = intra.alpha_us, intra.beta_us_per_byte, intra.gamma_us_per_byte
    local = (k - 1) * (2 * a + 2 * shard * b + shard * g)  # reduce-scatter + all-gather
    if nodes < 2:
        return local, "-"
    shared = inter.scaled(k if nic_shared else 1)
    across = {name: flat_time(name, nodes, shard, Level("x", shared.alpha_us,
                                                        shared.beta_us_per_byte, g), shared, 1)
              for name in ("ring", "rd")}
    if rule == "implemented":
        name = "rd" if shard < HIER_RD_MAX_BYTES else "ring"
    else:
        name = min(across, key=across.__getitem__)
    return local + across[name], name


def allreduce_time(algorithm: str, p: int, k: int, nbytes: float, intra: Level,
                   inter: Level, hier_rule: str = "best") -> float:
    """Microseconds of one all-reduce: ``ring``/``tree``/``rd``/``hier``."""
    if algorithm == "hier":
        return hier_time(p, min(k, p), nbytes, intra, inter, rule=hier_rule)[0]
    return flat_time(algorithm, p, nbytes, intra, inter, min(k, p))


def candidates(p: int, k: int) -> tuple:
    """The algorithms that apply: ``hier`` only across two or more whole nodes (on one node
    it IS the ring)."""
    return ALGORITHMS if p > k and p % k == 0 else FLAT


def best(p: int, k: int, nbytes: float, intra: Level, inter: Level,
         hier_rule: str = "best") -> tuple[str, float]:
    """(fastest algorithm, its microseconds)."""
    times = {a: allreduce_time(a, p, k, nbytes, intra, inter, hier_rule)
             for a in candidates(p, k)}
    name = min(times, key=times.__getitem__)
    return name, times[name]


def winners(rows: list[dict]) -> list[list]:
    """``[[upper bytes or None, algorithm], ...]``: the fastest algorithm by size range."""
    out: list = []
    for r in sorted(rows, key=lambda r: r["nbytes"]):
        if out and out[-1][1] == r["best"]:
            out[-1][0] = None
        else:
            if out:
                out[-1][0] = r["nbytes"]
            out.append([None, r["best"]])
    return out


# ---------------------------------------------------------------- DDP step

def buckets(grad_bytes: float) -> list[float]:
    """Bucket sizes for ``grad_bytes`` of gradients: 1 MiB first, then 25 MiB, the rest last."""
    out, left = [], grad_bytes
    for cap in [FIRST_BUCKET] + [BUCKET] * int(grad_bytes // BUCKET + 1):
        if left <= 0:
            break
        out.append(min(cap, left))
        left -= cap
    return out


def ddp_step(params: float, compute_ms: float, p: int, k: int, intra: Level, inter: Level,
             overlap: float, bytes_per_param: int = 4, hier_rule: str = "best") -> dict:
    """The modelled DDP step (weak scaling: same per-rank batch at every p)."""
    sizes = buckets(params * bytes_per_param)
    per = [best(p, k, s, intra, inter, hier_rule)[1] / 1e3 if p > 1 else 0.0 for s in sizes]
    comm, last = sum(per), per[-1]
    exposed = max(comm - overlap * BACKWARD_SHARE * compute_ms, min(comm, last))
    step = compute_ms + exposed
    return {"p": p, "comm_ms": comm, "exposed_ms": exposed, "step_ms": step,
            "efficiency": compute_ms / step, "buckets": len(sizes)}


# ---------------------------------------------------------------- reading measurements

def oversubscription(n: int, cores: int | None) -> float:
    """How much slower each rank runs with n ranks on ``cores`` cores (1 when n <= cores)."""
    return max(1.0, n / cores) if cores else 1.0


def ranks_per_node(result: dict) -> int | None:
    """Virtual nodes of a benchmark result (None: all ranks on one node)."""
    for holder in (result, result.get("topology") or {}, result.get("machine") or {}):
        if holder.get("ranks_per_node"):
            return int(holder["ranks_per_node"])
    nodes = result.get("nodes")  # hier.py: [[0, 1], [2, 3]]; allreduce.py: how many
    if isinstance(nodes, list) and len(nodes) > 1:
        return max(len(node) for node in nodes)
    if isinstance(nodes, int) and nodes > 1:
        return -(-int(result.get("n") or nodes) // nodes)
    m = re.search(r"MINIDIST_RANKS_PER_NODE=(\d+)", result.get("command", ""))
    return int(m.group(1)) if m else None


def expand(patterns: list[str]) -> list[Path]:
    """Files matching the patterns (relative to the repository), sorted, without repeats."""
    out: dict = {}
    for pat in patterns:
        base = pat if Path(pat).is_absolute() else str(REPO / pat)
        for f in sorted(glob.glob(base)):
            out[Path(f).resolve()] = None
    return list(out)


def load_points(paths: list[Path], algorithms: tuple = FLAT) -> dict:
    """{backend: [(n, nbytes, algorithm, median over runs of the median us, cores), ...]} from
    all-reduce benchmark files on one node (files with virtual nodes are left out)."""
    runs: dict = {}
    for path in paths:
        d = json.loads(path.read_text())
        if "rows" not in d or "n" not in d or ranks_per_node(d):
            continue
        cores = (d.get("machine") or {}).get("cores")
        for r in d["rows"]:
            if r["algorithm"] in algorithms and d["n"] > 1:
                key = (d.get("backend", "mpi"), d["n"], r["nbytes"], r["algorithm"], cores)
                runs.setdefault(key, []).append(r["median_us"])
    out: dict = {}
    for (backend, n, nbytes, algo, cores), v in sorted(runs.items(), key=str):
        out.setdefault(backend, []).append((n, nbytes, algo, float(np.median(v)), cores))
    return out


def load_hier(paths: list[Path], default_k: int) -> list[dict]:
    """Measured rows on virtual nodes (``hier``, and ``ring`` over the same path when the file
    has it), from ``benchmarks/hier.py`` or ``benchmarks/allreduce.py`` results:
    [{"n", "k", "nbytes", "algorithm", "median_us", "backend", "virtual", "cores", ...}]."""
    out = []
    for path in paths:
        d = json.loads(path.read_text())
        if not any(r.get("algorithm") == "hier" for r in d.get("rows", [])):
            continue
        k = ranks_per_node(d) or default_k
        cores = (d.get("machine") or {}).get("cores")
        for r in d["rows"]:
            if r.get("algorithm") in ("hier", "ring"):
                out.append({"n": d.get("n") or d.get("world_size"), "k": k,
                            "nbytes": r["nbytes"], "algorithm": r["algorithm"],
                            "median_us": r["median_us"],
                            "backend": d.get("backend") or d.get("transport") or "mpi",
                            "virtual": d.get("virtual", True), "cores": cores,
                            "inter_node_bytes": r.get("mean_inter_node_bytes"),
                            "source": shown(path)})
    return out


def stored_gamma(path: Path = REPO / GAMMA_SOURCE) -> float | None:
    """gamma (us per byte of a float32 add) measured by ``benchmarks/allreduce.py --fit``."""
    try:
        model = json.loads(path.read_text())["model"]
    except (OSError, KeyError, ValueError):
        return None
    values = [c["gamma_us_per_byte"] for c in model.values() if "gamma_us_per_byte" in c]
    return float(np.median(values)) if values else None


# ---------------------------------------------------------------- the fit

def terms(algorithm: str, n: int, nbytes: float) -> tuple[float, float, float]:
    """(alpha, beta, gamma) coefficients of one all-reduce on one node: time = a*A + b*B + g*G."""
    unit = [Level("u", *e) for e in ((1, 0, 0), (0, 1, 0), (0, 0, 1))]
    return tuple(flat_time(algorithm, n, nbytes, u) for u in unit)  # type: ignore[return-value]


def fit_level(name: str, points: list[tuple], gamma: float | None = None) -> dict:
    """Fit one level's alpha, beta (and gamma when ``gamma`` is None) to measured points.

    ``points``: (n, nbytes, algorithm, measured us, cores or None). Weighted least squares on
    relative error; each row is scaled by ``oversubscription(n, cores)``.

    Returns:
        ``{"level": Level, "points": [{"n", "nbytes", "algorithm", "measured_us",
        "predicted_us", "error"}], "median_abs_error", "p90_abs_error", "max_abs_error"}``.

    Raises:
        ValueError: with fewer points than unknowns, or when the points cannot tell beta from
        gamma (every formula moves them together); pass ``gamma`` then.
    """
    unknowns = 2 if gamma is not None else 3
    if len(points) < unknowns:
        raise ValueError(f"fit_level({name!r}): {len(points)} points for {unknowns} unknowns; "
                         f"give at least {unknowns} measured (n, size, algorithm) points")
    s = np.array([oversubscription(p[0], p[4]) for p in points])
    A = np.array([terms(algo, n, nbytes) for n, nbytes, algo, *_ in points]) * s[:, None]
    y = np.array([p[3] for p in points], float)
    w = 1.0 / y
    if gamma is None:
        scaled = A * w[:, None]
        norm = np.linalg.norm(scaled, axis=0)
        if np.linalg.matrix_rank(scaled / np.where(norm > 0, norm, 1), tol=1e-9) < 3:
            raise ValueError(f"fit_level({name!r}): these points cannot separate beta from "
                             "gamma (add recursive-doubling points below 64 KiB, or pass gamma)")
        (alpha, beta, gamma), *_ = np.linalg.lstsq(scaled, y * w, rcond=None)
    else:
        (alpha, beta), *_ = np.linalg.lstsq(A[:, :2] * w[:, None], (y - A[:, 2] * gamma) * w,
                                            rcond=None)
    level = Level(name, float(alpha), float(beta), float(gamma))
    pred = A @ np.array([level.alpha_us, level.beta_us_per_byte, level.gamma_us_per_byte])
    err = (pred - y) / y
    rows = [{"n": n, "nbytes": nbytes, "algorithm": algo, "measured_us": t,
             "predicted_us": float(pt), "error": float(e), "oversubscription": float(f)}
            for (n, nbytes, algo, t, _), pt, e, f in zip(points, pred, err, s)]
    ae = np.abs(err)
    return {"level": level, "points": rows, "median_abs_error": float(np.median(ae)),
            "p90_abs_error": float(np.quantile(ae, 0.9, method="higher")),
            "max_abs_error": float(ae.max())}


def holdout(name: str, points: list[tuple], gamma: float | None, world_size: int) -> dict | None:
    """Out of sample: fit without ``world_size``'s points, then predict them."""
    rest = [q for q in points if q[0] != world_size]
    held = [q for q in points if q[0] == world_size]
    if not held or len(rest) < 3:
        return None
    level = fit_level(name, rest, gamma)["level"]
    err = [(flat_time(algo, n, nbytes, level) * oversubscription(n, cores) - t) / t
           for n, nbytes, algo, t, cores in held]
    ae = np.abs(err)
    return {"level": name, "held_out_n": world_size, "fitted_on": sorted({q[0] for q in rest}),
            "constants": asdict(level), "points": len(held),
            "median_abs_error": float(np.median(ae)), "max_abs_error": float(ae.max())}


# Parameter counts of benchmarks/ddp_scaling.py's models (its docstring has the layer sizes).
DDP_BENCH_PARAMS = {"small": 64 * 256 + 256 + 256 * 10 + 10,
                    "large": 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 * 10 + 10}


def validate_ddp(path: Path, level: Level, overlap: float) -> list[dict]:
    """The DDP step predicted beside ``benchmarks/ddp_scaling.py``'s measurement on one node:
    compute = the same n processes without DDP, measured in the same run."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    out = []
    m = re.search(r"(\d+) cpus", str(data.get("machine", "")))
    cores = int(m.group(1)) if m else os.cpu_count()
    for res in data.get("results", []):
        rows = res.get("rows", [])
        for model, params in DDP_BENCH_PARAMS.items():
            plain = next((r for r in rows if r["model"] == model and not r["ddp"]), None)
            ddp = next((r for r in rows if r["model"] == model and r["ddp"] and r.get("overlap")
                        and "bucket_cap_mb" not in r), None)
            n = res.get("world_size", 1)
            if plain is None or ddp is None or n < 2:
                continue
            s = oversubscription(n, cores)
            slow = Level(level.name, level.alpha_us * s, level.beta_us_per_byte * s,
                         level.gamma_us_per_byte * s)
            pred = ddp_step(params, plain["step_ms"], n, n, slow, slow, overlap)
            out.append({"model": model, "n": n, "params": params,
                        "compute_ms": plain["step_ms"], "measured_step_ms": ddp["step_ms"],
                        "predicted_step_ms": pred["step_ms"],
                        "predicted_exposed_ms": pred["exposed_ms"],
                        "measured_exposed_ms": ddp.get("exposed_comm_ms"),
                        "error": (pred["step_ms"] - ddp["step_ms"]) / ddp["step_ms"]})
    return out


def validate_hier(rows: list[dict], levels: dict) -> list[dict]:
    """Predicted beside measured times on virtual nodes, and the ratio hier / ring where both
    were measured side by side (the ratio does not depend on how loaded the machine was).
    The inter level is the benchmark's transport; virtual nodes share no NIC; hier's inter
    phase as implemented. Each entry is a hier row (with ``ring_*`` keys when available)."""
    out = []
    ring = {(r["source"], r["nbytes"]): r for r in rows if r["algorithm"] == "ring"}
    same_run: dict = {}  # source -> Level fitted on that file's own ring rows
    for source in {r["source"] for r in rows}:
        pts = [(r["n"], r["nbytes"], "ring", r["median_us"], r["cores"]) for r in rows
               if r["source"] == source and r["algorithm"] == "ring" and r["virtual"]]
        gamma = levels["mpi"].gamma_us_per_byte if "mpi" in levels else None
        if len(pts) >= 2 and gamma is not None:
            same_run[source] = fit_level("same-run", pts, gamma)["level"]
    for h in rows:
        intra = levels.get("mpi")
        inter = levels.get(h["backend"], intra)
        if h["algorithm"] != "hier" or intra is None or h["n"] % h["k"]:
            continue
        n, k, nbytes, s = h["n"], h["k"], h["nbytes"], oversubscription(h["n"], h["cores"])
        t, across = hier_time(n, k, nbytes, intra, inter, nic_shared=not h["virtual"],
                              rule="implemented")
        entry = {**h, "predicted_us": t * s, "inter_algorithm": across,
                 "error": (t * s - h["median_us"]) / h["median_us"],
                 "inter_node_bytes_model": 2 * (n // k - 1) / (n // k) * nbytes / k}
        flat = ring.get((h["source"], nbytes))
        if flat is not None:
            tr = flat_time("ring", n, nbytes, intra, inter, k, nic_shared=not h["virtual"])
            measured, predicted = h["median_us"] / flat["median_us"], t / tr
            entry.update(ring_median_us=flat["median_us"], ring_predicted_us=tr * s,
                         ratio_measured=measured, ratio_predicted=predicted,
                         ratio_error=(predicted - measured) / measured)
        lv = same_run.get(h["source"])
        if lv is not None:  # constants of the same run's flat ring, one level (same path)
            t2 = hier_time(n, k, nbytes, lv, lv, nic_shared=False, rule="implemented")[0] * s
            entry.update(same_run_constants=asdict(lv), predicted_same_run_us=t2,
                         error_same_run=(t2 - h["median_us"]) / h["median_us"])
        out.append(entry)
    return out


# ---------------------------------------------------------------- predictions

def grid(args: argparse.Namespace, levels: dict) -> dict:
    """Times of every algorithm, the winners, crossovers and DDP efficiency, per link."""
    intra = levels["mpi"]
    sw = intra.alpha_us if args.software_alpha_us is None else args.software_alpha_us
    if args.intra_link:
        intra = link_level(*args.intra_link, sw, intra.gamma_us_per_byte)
    links = {}
    for gbps, lat in args.links:
        lv = link_level(gbps, lat, sw, intra.gamma_us_per_byte)
        links[lv.name] = lv
    if "tcp" in levels and not args.no_loopback_link:
        links["loopback-tcp"] = levels["tcp"]
    k = args.ranks_per_node
    out: dict = {"ranks_per_node": k, "software_alpha_us": sw, "intra": asdict(intra),
                 "hier_rule": args.hier_rule,
                 "links": {}}
    for name, inter in links.items():
        times = []
        for p in args.ranks:
            for nbytes in args.sizes:
                row: dict = {"p": p, "nbytes": nbytes, "hier": None}
                for a in candidates(p, k):
                    row[a] = allreduce_time(a, p, k, nbytes, intra, inter, args.hier_rule)
                row["best"] = min(candidates(p, k), key=row.__getitem__)
                times.append(row)
        cross = []
        for p in args.ranks:
            rows = [r for r in times if r["p"] == p]
            pairs = [("ring", "rd"), ("ring", "tree")] + ([("hier", "rd"), ("ring", "hier")]
                                                          if "hier" in candidates(p, k) else [])
            cross.append({"p": p, "winners": winners(rows),
                          **{f"{a}_vs_{b}": crossover(rows, a, b) for a, b in pairs}})
        ddp = [{"model": label, "params": params, "compute_ms": ms,
                **ddp_step(params, ms, p, k, intra, inter, args.overlap,
                           hier_rule=args.hier_rule)}
               for label, (params, ms) in args.models.items() for p in args.ranks]
        out["links"][name] = {"inter": asdict(inter), "times": times, "crossovers": cross,
                              "ddp": ddp}
    return out


def crossover(rows: list[dict], big: str, small: str) -> int | None:
    """Smallest size from which ``big`` is faster than ``small`` at every larger size (None:
    never at the largest size; 0: at every size)."""
    rows = sorted(rows, key=lambda r: r["nbytes"])
    cut = None
    for r in reversed(rows):
        if r[big] < r[small]:
            cut = r["nbytes"]
        else:
            break
    return 0 if cut == rows[0]["nbytes"] else cut


# ---------------------------------------------------------------- printing

def print_fit(fits: dict, gamma_note: str) -> None:
    t = Table([("level", 6, "s"), ("alpha(us)", 10, ".1f"), ("beta(us/B)", 11, ".3e"),
               ("GB/s", 6, ".2f"), ("gamma(us/B)", 11, ".3e"), ("points", 6, "d"),
               ("med|err|", 8, ".1%"), ("p90|err|", 8, ".1%"), ("max|err|", 8, ".1%")])
    print(f"# fitted levels ({gamma_note}; times scaled by max(1, n/cores))")
    print(t.header())
    for f in fits.values():
        lv = f["level"]
        print(t.row(lv.name, lv.alpha_us, lv.beta_us_per_byte, 1e-3 / lv.beta_us_per_byte,
                    lv.gamma_us_per_byte, len(f["points"]), f["median_abs_error"],
                    f["p90_abs_error"], f["max_abs_error"]))


def print_validation(fits: dict, hier: list[dict], show: list[int]) -> None:
    t = Table([("level", 6, "s"), ("n", 3, "d"), ("algo", 5, "s"), ("size", 8, "s"),
               ("measured", 10, ".0f"), ("predicted", 10, ".0f"), ("error", 7, "s")])
    print("# predicted vs measured (us), a few sizes; every point in the JSON")
    print(t.header())
    for f in fits.values():
        for r in f["points"]:
            if r["nbytes"] in show:
                print(t.row(f["level"].name, r["n"], r["algorithm"], human(r["nbytes"]),
                            r["measured_us"], r["predicted_us"], f"{r['error']:+.0%}"))
    summary = Table([("level", 6, "s"), ("n", 3, "d"), ("algo", 5, "s"), ("points", 6, "d"),
                     ("med|err|", 8, ".0%"), ("max|err|", 8, ".0%")])
    print("# error per level, world size and algorithm")
    print(summary.header())
    for f in fits.values():
        groups: dict = {}
        for r in f["points"]:
            groups.setdefault((r["n"], r["algorithm"]), []).append(abs(r["error"]))
        for (n, algo), e in sorted(groups.items()):
            print(summary.row(f["level"].name, n, algo, len(e), float(np.median(e)), max(e)))
    if hier:
        print("# hier on virtual nodes: predicted vs measured (us), and hier/ring measured side "
              "by side")
        h = Table([("n", 3, "d"), ("k", 3, "d"), ("size", 8, "s"), ("measured", 9, ".0f"),
                   ("predicted", 9, ".0f"), ("error", 6, "s"), ("same-run", 9, ".0f"),
                   ("error", 6, "s"), ("hier/ring", 9, ".2f"), ("pred", 5, ".2f"),
                   ("error", 6, "s")])
        print("# predicted: fitted levels; same-run: constants fitted on the flat ring rows of "
              "the same file")
        print(h.header())
        for r in hier:
            ratio, same = "ratio_measured" in r, "predicted_same_run_us" in r
            print(h.row(r["n"], r["k"], human(r["nbytes"]), r["median_us"], r["predicted_us"],
                        f"{r['error']:+.0%}", r.get("predicted_same_run_us"),
                        f"{r['error_same_run']:+.0%}" if same else None,
                        r.get("ratio_measured"), r.get("ratio_predicted"),
                        f"{r['ratio_error']:+.0%}" if ratio else None))
        c = hier[0].get("same_run_constants")
        if c:
            print(f"# same-run constants ({hier[0]['source']}): alpha {c['alpha_us']:.0f} us, "
                  f"beta {c['beta_us_per_byte']:.2e} us/B")
    else:
        print("# hier: no measured result with virtual nodes found (--hier); predictions only")


def print_checks(held: list[dict], ddp: list[dict]) -> None:
    t = Table([("level", 6, "s"), ("held out", 8, "d"), ("fitted on", 9, "s"),
               ("alpha(us)", 9, ".1f"), ("beta(us/B)", 10, ".2e"), ("med|err|", 8, ".0%"),
               ("max|err|", 8, ".0%")])
    print("# out of sample: fit without one world size, predict it")
    print(t.header())
    for h in held:
        c = h["constants"]
        print(t.row(h["level"], h["held_out_n"], ",".join(map(str, h["fitted_on"])),
                    c["alpha_us"], c["beta_us_per_byte"], h["median_abs_error"],
                    h["max_abs_error"]))
    if ddp:
        d = Table([("model", 6, "s"), ("n", 3, "d"), ("compute", 8, ".2f"),
                   ("measured", 9, ".2f"), ("predicted", 9, ".2f"), ("error", 7, "s"),
                   ("exposed meas/pred", 18, "s")])
        print("# DDP step of the measured machine (ms): compute = the same n processes without "
              "DDP")
        print(d.header())
        for r in ddp:
            exposed = f"{r['measured_exposed_ms'] or 0:.2f}/{r['predicted_exposed_ms']:.2f}"
            print(d.row(r["model"], r["n"], r["compute_ms"], r["measured_step_ms"],
                        r["predicted_step_ms"], f"{r['error']:+.0%}", exposed))


def print_grid(g: dict, show_p: list[int], show_sizes: list[int]) -> None:
    k = g["ranks_per_node"]
    for name, link in g["links"].items():
        inter = link["inter"]
        print(f"# link {name}: alpha_e {inter['alpha_us']:.1f} us, beta_e "
              f"{inter['beta_us_per_byte']:.2e} us/B; {k} ranks/node; all-reduce time (us)")
        t = Table([("p", 5, "d"), ("size", 8, "s"), ("ring", 11, ".0f"), ("tree", 11, ".0f"),
                   ("rd", 11, ".0f"), ("hier", 11, ".0f"), ("best", 5, "s")])
        print(t.header())
        for r in link["times"]:
            if r["p"] in show_p and r["nbytes"] in show_sizes:
                print(t.row(r["p"], human(r["nbytes"]), r["ring"], r["tree"], r["rd"],
                            r["hier"], r["best"]))
        c = Table([("p", 5, "d"), ("ring<rd from", 12, "s"), ("ring<tree from", 14, "s"),
                   ("hier<rd from", 12, "s"), ("ring<hier from", 14, "s"),
                   ("fastest by size", 50, "s")])
        print("# crossovers: the size from which the first is faster at every larger size")
        print(c.header())
        for r in link["crossovers"]:
            if r["p"] in show_p:
                print(c.row(r["p"], *[size_text(r.get(key, -1)) for key in
                                      ("ring_vs_rd", "ring_vs_tree", "hier_vs_rd",
                                       "ring_vs_hier")], winners_text(r["winners"])))
        d = Table([("model", 12, "s"), ("p", 5, "d"), ("comm(ms)", 9, ".1f"),
                   ("exposed(ms)", 11, ".1f"), ("step(ms)", 9, ".1f"), ("efficiency", 10, ".1%")])
        print("# DDP step (weak scaling)")
        print(d.header())
        for r in link["ddp"]:
            if r["p"] in show_p:
                print(d.row(r["model"], r["p"], r["comm_ms"], r["exposed_ms"], r["step_ms"],
                            r["efficiency"]))


def size_text(nbytes: int | None) -> str:
    return ("-" if nbytes == -1 else "never" if nbytes is None else "always" if nbytes == 0
            else human(nbytes))


def winners_text(segments: list) -> str:
    """``[[2048, "rd"], [None, "ring"]]`` -> ``"rd < 2 KiB <= ring"``."""
    return " ".join(f"{a} < {human(u)} <=" if u else a for u, a in segments)


# ---------------------------------------------------------------- plots

def plots(result: dict, folder: Path, show_p: list[int]) -> list[Path]:
    """scaling_validation / scaling_crossover / scaling_winners / scaling_ddp .png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    colors = {"ring": "C0", "tree": "C1", "rd": "C2", "hier": "C3"}

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for name, f in result["fit"].items():
        pts = f["points"]
        ax.scatter([r["measured_us"] for r in pts], [r["predicted_us"] for r in pts], s=10,
                   label=f"{name} (median |err| {f['median_abs_error']:.0%})")
    hier = result["validation_hier"]
    if hier:
        ax.scatter([r["median_us"] for r in hier], [r["predicted_us"] for r in hier], s=25,
                   marker="x", color="k", label="hier, virtual nodes")
    lo, hi = ax.get_xlim()
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured (us)", ylabel="predicted (us)",
           title="all-reduce: model vs measurement, n=2..4")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    written.append(_save(fig, folder / "scaling_validation.png"))

    links = result["grid"]["links"]
    main = next((n for n in links if n.startswith("100")), next(iter(links)))
    ps = [p for p in show_p if p >= 16][-2:] or show_p[-2:]
    fig, axes = plt.subplots(1, len(ps), figsize=(6 * len(ps), 4.5), squeeze=False)
    for ax, p in zip(axes[0], ps):
        rows = [r for r in links[main]["times"] if r["p"] == p]
        for a in ALGORITHMS:
            pts = [r for r in rows if r.get(a) is not None]
            ax.plot([r["nbytes"] for r in pts], [r[a] for r in pts], ".-", label=a,
                    color=colors[a])
        ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time (us)",
               title=f"p={p}, {result['grid']['ranks_per_node']} ranks/node, link {main}")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(_save(fig, folder / "scaling_crossover.png"))

    cols = 2 if len(links) > 2 else len(links)  # a 2 x 2 grid: each panel big enough to read
    grid_rows = math.ceil(len(links) / cols)
    fig, axes = plt.subplots(grid_rows, cols, figsize=(6.2 * cols, 4.8 * grid_rows + 0.6),
                             squeeze=False)
    # the legend lists only the algorithms that win somewhere
    algos = [a for a in ALGORITHMS if any(r["best"] == a for link in links.values()
                                          for r in link["times"])]
    cmap = matplotlib.colors.ListedColormap([colors[a] for a in algos])
    for ax in axes.flat[len(links):]:
        ax.set_axis_off()
    for ax, (name, link) in zip(axes.flat, links.items()):
        ps_ = sorted({r["p"] for r in link["times"]})
        ss = sorted({r["nbytes"] for r in link["times"]})
        cell = {(r["p"], r["nbytes"]): algos.index(r["best"]) for r in link["times"]}
        img = np.array([[cell[(p, s)] for s in ss] for p in ps_])
        ax.imshow(img, cmap=cmap, vmin=-0.5, vmax=len(algos) - 0.5, aspect="auto",
                  origin="lower")
        every = max(1, math.ceil(len(ss) / 9))  # about 9 size ticks
        ax.set_xticks(range(0, len(ss), every), [human(s).replace(" ", "")
                                                 for s in ss[::every]],
                      rotation=45, fontsize=10)
        ax.set_yticks(range(len(ps_)), [str(p) for p in ps_], fontsize=10)
        ax.set_xlabel("message size", fontsize=11)
        ax.set_ylabel("ranks p", fontsize=11)
        ax.set_title(f"fastest algorithm, link {name}", fontsize=12)
    handles = [matplotlib.patches.Patch(color=colors[a], label=a) for a in algos]
    fig.legend(handles=handles, loc="lower center", ncol=len(algos), fontsize=11,
               frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    written.append(_save(fig, folder / "scaling_winners.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for j, (name, link) in enumerate(links.items()):
        for i, label in enumerate(dict.fromkeys(r["model"] for r in link["ddp"])):
            rows = [r for r in link["ddp"] if r["model"] == label]
            ax.plot([r["p"] for r in rows], [r["efficiency"] for r in rows],
                    ["-", "--", ":"][i % 3], color=f"C{j}", marker=".",
                    label=f"{label}, {name}")
    ax.set(xscale="log", xlabel="ranks p", ylabel="efficiency = compute / step",
           ylim=(0, 1.05), title=f"DDP weak scaling, overlap {result['assumptions']['overlap']}")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(_save(fig, folder / "scaling_ddp.png"))
    return written


def _save(fig: "object", path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--inputs", nargs="+", default=DEFAULT_INPUTS,
                   help="all-reduce benchmark JSON files (globs, relative to the repository)")
    p.add_argument("--hier", nargs="+", default=DEFAULT_HIER,
                   help="results with measured 'hier' rows (virtual nodes), if any")
    p.add_argument("--hier-ranks-per-node", type=int, default=2,
                   help="k of a hier result that does not record it (default 2)")
    p.add_argument("--measure-gamma", action="store_true",
                   help=f"time a NumPy add instead of reading gamma from {GAMMA_SOURCE}")
    p.add_argument("--fit-gamma", action="store_true",
                   help="fit gamma too (needs points that separate it from beta)")
    p.add_argument("--links", nargs="+", default=["25:5", "100:5", "400:5"],
                   help="inter-node links GBPS:LATENCY_US (default 25:5 100:5 400:5)")
    p.add_argument("--no-loopback-link", action="store_true",
                   help="leave out the measured loopback-TCP level as a link")
    p.add_argument("--software-alpha-us", type=float, default=None,
                   help="per-message software cost added to a link's latency "
                        "(default: the fitted intra-node alpha)")
    p.add_argument("--intra-link", default=None, metavar="GBPS:LATENCY_US",
                   help="model the intra-node level as this link instead of the fitted one")
    p.add_argument("--hier-rule", choices=("best", "implemented"), default="best",
                   help="hier's inter-node algorithm: the cheaper of ring and rd (best), or "
                        "minidist's (rd below HIER_RD_MAX_BYTES per shard, else ring)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--max-ranks", type=int, default=4096)
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="1G")
    p.add_argument("--model", nargs="+", default=["25M:100", "350M:300"],
                   help="DDP models PARAMS:COMPUTE_MS (default 25M:100 350M:300)")
    p.add_argument("--overlap", type=float, default=0.8,
                   help="fraction of backward that bucket communication can hide behind")
    p.add_argument("--ddp-results", default="benchmarks/results/ddp_scaling.json",
                   help="benchmarks/ddp_scaling.py's JSON to check the DDP step against")
    p.add_argument("--quick", action="store_true", help="a small grid (a few seconds)")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="directory for the JSON")
    p.add_argument("--name", default="scale_model", help="JSON file stem")
    p.add_argument("--plots", default=None, metavar="DIR", help="write scaling_*.png there")
    a = p.parse_args(argv)
    if a.ranks_per_node < 1 or a.max_ranks < 2:
        raise SystemExit("--ranks-per-node must be >= 1 and --max-ranks >= 2")
    if not 0 <= a.overlap <= 1:
        raise SystemExit(f"--overlap must be in [0, 1], got {a.overlap}")
    a.links = [parse_link(x) for x in a.links]
    a.intra_link = parse_link(a.intra_link) if a.intra_link else None
    a.models = {m: parse_model(m) for m in a.model}
    step = 16 if a.quick else 4
    lo, hi = parse_bytes(a.min_bytes), parse_bytes(a.max_bytes)
    a.sizes, s = [], lo
    while s <= hi:
        a.sizes.append(s)
        s *= step
    a.ranks, r = [], 2
    while r <= a.max_ranks:
        a.ranks.append(r)
        r *= 2
    if a.quick:
        a.ranks = [r for r in a.ranks if r in (2, 8, 64, 512, 4096)]
    a.ranks = sorted(set(a.ranks) | ({a.ranks_per_node * 2} if a.ranks_per_node * 2 <= a.max_ranks
                                     else set()))
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    points = load_points(expand(args.inputs))
    if "mpi" not in points:
        raise SystemExit("scale_model: no one-node MPI all-reduce results among --inputs "
                         f"{args.inputs}; run ./mpirun.sh -n 2 python benchmarks/allreduce.py "
                         "--out benchmarks/results first")
    if args.fit_gamma:
        gamma, note = None, "gamma fitted"
    elif args.measure_gamma or stored_gamma() is None:
        from allreduce import gamma_us_per_byte

        gamma, note = gamma_us_per_byte(), "gamma timed now (NumPy float32 add)"
    else:
        gamma, note = stored_gamma(), f"gamma from {GAMMA_SOURCE}"
    fits = {backend: fit_level(backend, pts, gamma) for backend, pts in points.items()}
    levels = {b: f["level"] for b, f in fits.items()}
    hier = validate_hier(load_hier(expand(args.hier), args.hier_ranks_per_node), levels)
    held = [h for b, pts in points.items() for n in sorted({q[0] for q in pts})
            if (h := holdout(b, pts, gamma, n)) is not None]
    ddp = validate_ddp(REPO / args.ddp_results, levels["mpi"], args.overlap)
    files = expand(args.inputs)
    print(f"# fitted to {len(files)} result file(s) of --inputs"
          + (" (the shipped benchmarks/results/, measured on the machine of docs/benchmarks.md;"
             " pass --inputs with your own allreduce.py JSON to fit this machine)"
             if args.inputs == DEFAULT_INPUTS else f": {', '.join(map(str, files))}"))
    print_fit(fits, note)
    print_validation(fits, hier, [8, 64 << 10, 1 << 20, 8 << 20])
    print_checks(held, ddp)
    g = grid(args, levels)
    show_p = [p for p in args.ranks if p in (2, 2 * args.ranks_per_node, 64, 512, 4096)]
    show_sizes = [s for s in args.sizes if s in (8, 2 << 10, 32 << 10, 512 << 10, 8 << 20,
                                                 128 << 20)] or args.sizes
    print_grid(g, show_p, show_sizes)
    result = {
        "machine": machine_info(), "command": " ".join(["benchmarks/scale_model.py", *sys.argv[1:]])
        if argv is None else " ".join(["benchmarks/scale_model.py", *argv]),
        "inputs": [shown(p) for p in expand(args.inputs)],
        "assumptions": {"overlap": args.overlap, "backward_share": BACKWARD_SHARE,
                        "buckets_bytes": [FIRST_BUCKET, BUCKET], "bytes_per_param": 4,
                        "placement": "consecutive ranks per node",
                        "oversubscription": "measured times scaled by max(1, n/cores)",
                        "links": "alpha = latency + software alpha, beta = 1/bandwidth",
                        "gamma": note},
        "fit": {b: {**{k: v for k, v in f.items() if k != "level"}, "constants":
                    asdict(f["level"])} for b, f in fits.items()},
        "validation_hier": hier, "holdout": held, "validation_ddp": ddp, "grid": g,
        "elapsed_s": time.perf_counter() - t0}
    for f in result["fit"].values():
        f["level"] = f["constants"]["name"]
    path = write_json(Path(args.out) / f"{args.name}.json", result)
    print(f"# wrote {shown(path)}")
    if args.plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("# matplotlib is not installed: no plots (the tables above hold the numbers)")
        else:
            for png in plots(result, Path(args.plots), show_p):
                print(f"# wrote {shown(png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
