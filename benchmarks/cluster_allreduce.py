"""All-reduce across real nodes on one machine, per link rate, beside scale_model's prediction.

    sudo .venv/bin/python benchmarks/cluster_allreduce.py                  # 1 and 10 Gbit
    sudo .venv/bin/python benchmarks/cluster_allreduce.py --rates 1gbit --max-bytes 4M
    sudo .venv/bin/python benchmarks/cluster_allreduce.py --out benchmarks/results

For each rate: ``minidist.testing.cluster`` builds 2 namespace nodes whose links run at that
rate (``tc tbf``), the TCP launcher starts ``--nproc-per-node`` ranks on each, and they run
``benchmarks/allreduce.py --backend tcp`` (ring, rd, hier, auto; interleaved, medians). Beside
every measured median: ``benchmarks/scale_model.py``'s prediction for that machine::

    intra-node level  the "tcp" level fitted on the stored loopback-TCP results
                      (benchmarks/results/scale_tcp_n*.json, allreduce_tcp_n2.json): the ranks
                      of one node talk TCP over the loopback here too
    inter-node level  scale_model.link_level(rate, latency 0, software alpha = the tcp
                      alpha, gamma): beta = 1 / rate, no per-byte software cost
    hier              hier_time(..., rule="implemented"): what minidist's hier runs

and a second prediction ("+cpu") for what this machine adds: all ranks of all nodes share its
cores, so every software cost (alpha, the TCP stack's per-byte copy cost = the tcp level's
beta, gamma) runs ``scale_model.oversubscription(p, cores)`` times slower, and a byte crossing
the link pays the copy cost on top of 1 / rate. ``unlimited`` (no tbf) uses the loopback-TCP
level as the link, as scale_model's "loopback-tcp" link does. Only link-bound sizes (the time
well above the software's) measure the network. Prints one Markdown table per rate and
writes ``cluster_allreduce.json`` to --out (default runs/bench/). Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _common import LOCAL_RESULTS, REPO, human, machine_info, parse_bytes, shown, write_json

import scale_model as sm

ALGORITHMS = ("ring", "rd", "hier")
TCP_RESULTS = ["benchmarks/results/scale_tcp_n*.json", "benchmarks/results/allreduce_tcp_n2.json"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="1gbit,10gbit,unlimited",
                   help="link rates, tc units, or unlimited (no tbf: the veth's own speed); "
                        "default 1gbit,10gbit,unlimited")
    p.add_argument("--nodes", type=int, default=2, help="nodes (default 2)")
    p.add_argument("--nproc-per-node", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument("--min-bytes", default="256K")
    p.add_argument("--max-bytes", default="16M")
    p.add_argument("--iters", type=int, default=10, help="timed calls per point (default 10)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per rate (default 600)")
    p.add_argument("--out", default=str(LOCAL_RESULTS), help="directory for the JSON")
    p.add_argument("--name", default="cluster_allreduce", help="JSON file stem")
    return p.parse_args(argv)


def gbps(rate: str) -> float:
    from minidist.testing.cluster import rate_bytes_per_s

    return rate_bytes_per_s(rate) * 8 / 1e9


def measure(rate: str, a: argparse.Namespace) -> dict:
    """One cluster at ``rate``: the all-reduce benchmark's JSON result."""
    from minidist.testing.cluster import Cluster

    with tempfile.TemporaryDirectory(prefix="cluster_allreduce-") as tmp:
        args = ["benchmarks/allreduce.py", "--backend", "tcp", "--no-gloo", "--no-plot",
                "--algorithms", ",".join((*ALGORITHMS, "auto")), "--min-bytes", a.min_bytes,
                "--max-bytes", a.max_bytes, "--step", "4", "--iters", str(a.iters),
                "--warmup", "1", "--out", tmp, "--name", "run"]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with Cluster(a.nodes, None if rate == "unlimited" else rate, echo=True) as c:
            jobs = c.launch_tcp(args, a.nproc_per_node, env, cwd=str(REPO))
            results = c.wait(jobs, a.timeout)
            links = [c.link_stats(n.index) for n in c.nodes]
        bad = [r for r in results if r.returncode != 0]
        if bad:
            raise SystemExit(f"cluster_allreduce: the run at {rate} failed:\n"
                             + "\n".join(r.report() for r in bad))
        out = json.loads((Path(tmp) / "run.json").read_text())
    out.pop("machine", None)
    out["links"] = links  # per node: bytes sent, packets dropped by tbf (the whole run)
    out["command"] = " ".join(["python -m minidist.launch ...", *args[:-4]])
    return out


def tcp_level() -> tuple:
    """The fitted loopback-TCP level (scale_model.fit_level) and gamma, as scale_model does."""
    points = sm.load_points(sm.expand(TCP_RESULTS))
    if "tcp" not in points:
        raise SystemExit(f"cluster_allreduce: no TCP results among {TCP_RESULTS}")
    gamma = sm.stored_gamma()
    fit = sm.fit_level("tcp", points["tcp"], gamma)
    return fit["level"], fit["level"].gamma_us_per_byte


def predict(rate: str, p: int, k: int, nbytes: int, intra: sm.Level, cores: int) -> dict:
    """{algorithm: (model us, model+cpu us)} at this rate ("unlimited": the link is the
    loopback-TCP level itself, scale_model's "loopback-tcp" link)."""
    g = intra.gamma_us_per_byte
    f = sm.oversubscription(p, cores)  # p ranks on this machine's cores, whatever the nodes
    slow = sm.Level(intra.name, intra.alpha_us * f, intra.beta_us_per_byte * f, g * f)
    if rate == "unlimited":
        link, cpu = intra, slow
    else:
        link = sm.link_level(gbps(rate), 0.0, intra.alpha_us, g)
        cpu = sm.Level(link.name, slow.alpha_us,
                       link.beta_us_per_byte + slow.beta_us_per_byte, g * f)
    return {a: (sm.allreduce_time(a, p, k, nbytes, intra, link, "implemented"),
                sm.allreduce_time(a, p, k, nbytes, slow, cpu, "implemented"))
            for a in ALGORITHMS}


def table(rate: str, run: dict, intra: sm.Level, k: int) -> tuple[str, list[dict]]:
    """Markdown: per size, measured / model / model+cpu (ms) per algorithm, and ring/hier."""
    by = {(r["nbytes"], r["algorithm"]): r for r in run["rows"]}
    head = (["size"] + [f"{a} meas / model / +cpu (ms)" for a in ALGORITHMS]
            + ["ring/hier meas", "ring/hier model", "auto chose", "#wrong"])
    drops = ", ".join(f"node{i} sent {s.get('sent_bytes', 0) / 2**20:.0f} MiB, "
                      f"{s.get('dropped', 0)} packets dropped" for i, s in enumerate(run["links"]))
    lines = [f"{rate} links, {run['n']} ranks on {run['nodes']} nodes ({drops}):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for nbytes in sorted({r["nbytes"] for r in run["rows"]}):
        pred = predict(rate, run["n"], k, nbytes, intra, os.cpu_count() or 1)
        meas = {a: by[(nbytes, a)]["median_us"] for a in ALGORITHMS}
        cells = [human(nbytes)] + [f"{meas[a] / 1e3:.2f} / {pred[a][0] / 1e3:.2f} / "
                                   f"{pred[a][1] / 1e3:.2f}" for a in ALGORITHMS]
        cells += [f"{meas['ring'] / meas['hier']:.2f}",
                  f"{pred['ring'][0] / pred['hier'][0]:.2f}",
                  by[(nbytes, "auto")].get("chose", "-"),
                  str(sum(by[(nbytes, a)]["wrong"] for a in (*ALGORITHMS, "auto")))]
        lines.append("| " + " | ".join(cells) + " |")
        rows.append({"nbytes": nbytes, "measured_us": meas,
                     "model_us": {a: v[0] for a, v in pred.items()},
                     "model_cpu_us": {a: v[1] for a, v in pred.items()},
                     "auto_chose": by[(nbytes, "auto")].get("chose")})
    return "\n".join(lines), rows


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from minidist.testing.cluster import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"cluster_allreduce: minidist.testing.cluster {reason}", file=sys.stderr)
        return 1
    parse_bytes(a.min_bytes), parse_bytes(a.max_bytes)  # fail early on a bad size
    intra, gamma = tcp_level()
    print(f"# model: intra = fitted tcp level (alpha {intra.alpha_us:.1f} us, beta "
          f"{intra.beta_us_per_byte:.2e} us/B), gamma {gamma:.2e} us/B; link beta = 1/rate",
          flush=True)
    t0 = time.perf_counter()
    result: dict = {"machine": machine_info(),
                    "command": " ".join(["benchmarks/cluster_allreduce.py",
                                         *(sys.argv[1:] if argv is None else argv)]),
                    "model": {"intra": vars(intra), "hier_rule": "implemented",
                              "link": "scale_model.link_level(rate, 0, tcp alpha, gamma)",
                              "cpu": "link beta + tcp beta"},
                    "rates": {}}
    tables = []
    for rate in [r.strip() for r in a.rates.split(",") if r.strip()]:
        run = measure(rate, a)
        text, rows = table(rate, run, intra, a.nproc_per_node)
        tables.append(text)
        result["rates"][rate] = {"run": run, "rows": rows}
        print("\n" + text + "\n", flush=True)
    result["elapsed_s"] = time.perf_counter() - t0
    result["tables"] = tables
    path = write_json(Path(a.out) / f"{a.name}.json", result)
    print("\n\n".join(tables))
    print(f"# wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
