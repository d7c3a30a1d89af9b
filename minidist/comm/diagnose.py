"""Compare the ranks' ledgers after a failure and say, in one sentence, where they first differ.

    d = diagnose(stream=0, reports={0: report0, 1: report1}, missing={2: "no answer within 3 s"})
    d["text"]   # "rank 1 called broadcast(1024 x float32, src=0) as its collective #3 at
                #  bad.py:57; rank 0 called all_reduce(1024 x float32, sum) at bad.py:61"
    d["kind"]   # "mismatch" | "missing" | "same"

A report is what a rank sends in the failure exchange (``comm/failure.py``)::

    {"rank": 1, "state": "timed out in all_reduce #3", "counts": {"0": 3},
     "entries": [ledger records, oldest first: {"seq", "stream", "collective", "op", "count",
                 "dtype", "root", "algorithm", "label", "file", "line", ...}]}

The rule, per call number on the stream, oldest first (within what every rank still holds):
the *signature* of a call is (collective, op, dtype, count, root, algorithm); the first call
number whose signatures are not all equal - a rank that made no call that far counts as a
signature of its own - is the finding. Ranks are grouped by signature; the smallest group is
named first (for two ranks: rank 0 last), so every rank prints the same sentence. Call sites
(file:line) are not part of the signature (``if rank == 0: broadcast_object(x) else:
broadcast_object(None)`` is correct code), but the first completed call number where they differ
before the finding is reported as a note: with identical arguments, a rank that skipped a
collective pairs its next call with the others' skipped one, and only the line numbers show it.
Pure functions: no messages, no transport (tests call them directly).
"""

from __future__ import annotations

import os
from typing import Any

from minidist.comm.ledger import describe

FIELDS = ("collective", "op", "dtype", "count", "root", "algorithm")


def signature(e: dict | None) -> tuple | None:
    """What must agree across ranks for one call (None: the rank made no such call)."""
    return None if e is None else tuple(e[k] for k in FIELDS)


def site(e: dict) -> str:
    """``bad.py:57``."""
    return f"{os.path.basename(e['file'])}:{e['line']}"


def _ranks(rs: list[int]) -> str:
    return (f"rank {rs[0]}" if len(rs) == 1 else
            "ranks " + ", ".join(map(str, rs)))


def _call_text(e: dict, with_algorithm: bool) -> str:
    text = describe(e)
    return f"{text} [algorithm {e['algorithm']}]" if with_algorithm else text


def diagnose(stream: int, reports: dict[int, dict], missing: dict[int, str] | None = None
             ) -> dict[str, Any]:
    """The first difference between the ranks' ledgers on ``stream`` (see module docstring).

    Args:
        stream: the stream (``tag``) of the failed collective.
        reports: rank -> its report (this rank's own included).
        missing: rank -> why it sent no report ("dead: ...", "no answer within 3 s").

    Returns:
        ``{"kind", "text", "seq", "groups": [{"ranks", "call", "where"}], "missing",
        "site_note"}``; ``kind`` is "mismatch" (calls differ at ``seq``), "missing" (no
        difference among the ranks that answered, and some did not) or "same" (every rank made
        the same calls: the failure is not a mismatch).
    """
    missing = dict(missing or {})
    calls = {r: {e["seq"]: e for e in rep.get("entries", []) if e["stream"] == stream}
             for r, rep in reports.items()}
    counts = {r: int(rep.get("counts", {}).get(str(stream), 0)) for r, rep in reports.items()}
    # Compare only call numbers every rank still holds (their ring buffers may differ in depth).
    lo = max((min(c) if c else counts[r] + 1) for r, c in calls.items())
    hi = max(counts.values(), default=0)
    first, note = None, None
    for seq in range(lo, hi + 1):
        entry = {r: calls[r].get(seq) if seq <= counts[r] else None for r in reports}
        sigs = {r: signature(e) for r, e in entry.items()}
        if len(set(sigs.values())) > 1:
            first = (seq, entry, sigs)
            break
        sites = {site(e) for e in entry.values() if e is not None}
        done = all(e is not None and e.get("status", "ok") == "ok" for e in entry.values())
        if note is None and len(sites) > 1 and done:
            note = (seq, entry)
    out: dict[str, Any] = {"stream": stream, "missing": missing, "seq": None, "groups": [],
                           "site_note": None}
    parts = []
    if first is not None:
        seq, entry, sigs = first
        groups: dict = {}
        for r in sorted(entry):
            groups.setdefault(sigs[r], []).append(r)
        order = sorted(groups.values(), key=lambda rs: (len(rs), 0 in rs, rs))
        algos_differ = len({s[:5] for s in groups if s is not None}) < len(
            [s for s in groups if s is not None])
        texts = []
        for i, rs in enumerate(order):
            e = entry[rs[0]]
            if e is None:
                r0 = rs[0]
                last = calls[r0].get(counts[r0])
                text = f"{_ranks(rs)} made no collective #{seq}"
                if last is not None:
                    text += f" (last: #{counts[r0]}, {describe(last)} at {site(last)})"
                state = reports[r0].get("state")
                if state:
                    text += f" and {'is' if len(rs) == 1 else 'are'} {state}"
            else:
                call = _call_text(e, algos_differ)
                text = (f"{_ranks(rs)} called {call}"
                        + (f" as {'its' if len(rs) == 1 else 'their'} collective #{seq}"
                           if i == 0 else "") + f" at {site(e)}")
            texts.append(text)
            out["groups"].append({"ranks": rs, "call": None if e is None else describe(e),
                                  "where": None if e is None else site(e)})
        out["seq"] = seq
        parts.append("; ".join(texts))
        kind = "mismatch"
    else:
        kind = "missing" if missing else "same"
        last = {r: calls[r].get(counts[r]) for r in reports}
        e = next((x for x in last.values() if x is not None), None)
        for r in sorted(missing):
            parts.append(f"rank {r} {missing[r]}")
        if e is not None:
            out["seq"] = e["seq"]
            if missing:
                rs = sorted(reports)
                parts.append(f"{_ranks(rs)} {'is' if len(rs) == 1 else 'are'} in collective "
                             f"#{e['seq']}, {describe(e)} at {site(e)}"
                             + ("" if len(rs) == 1 else " (their calls agree)"))
            else:
                parts.append(f"every rank called {describe(e)} as collective #{e['seq']} at "
                             f"{site(e)}, with the same arguments")
    if first is not None:
        for r in sorted(missing):
            parts.append(f"rank {r} {missing[r]}")
    if note is not None and (first is None or note[0] < first[0]):
        seq, entry = note
        by_site: dict = {}
        for r in sorted(entry):
            by_site.setdefault(site(entry[r]), []).append(r)
        where = ", ".join(f"{_ranks(rs)} at {s}" for s, rs in by_site.items())
        out["site_note"] = {"seq": seq, "sites": {s: rs for s, rs in by_site.items()}}
        fewest = min(counts.values())
        short = sorted(r for r, c in counts.items() if c == fewest)
        who = (f" ({_ranks(short)} made fewer calls)" if len(short) < len(counts) else "")
        parts.append(f"note: collective #{seq} ran at different lines on different ranks "
                     f"({where}) with the same arguments, so those calls were paired; unless "
                     f"they are the same call of your program, a rank skipped or added a "
                     f"collective there{who} and from there on the results were wrong")
    out["kind"] = kind
    out["text"] = "; ".join(parts) if parts else "no ledger entries to compare"
    return out
