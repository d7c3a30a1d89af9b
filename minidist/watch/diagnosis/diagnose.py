"""Compare the ranks' ledgers after a failure and say, in one sentence, where they first differ.

    d = diagnose(stream=0, reports={0: report0, 1: report1}, missing={2: "no answer within 3 s"})
    d["text"]   # "rank 1 called broadcast(1024 x float32, src=0) as its collective #3 at
                #  bad.py:57; rank 0 called all_reduce(1024 x float32, sum) at bad.py:61"
    d["kind"]   # "mismatch" | "missing" | "same"

A report is what a rank sends in the failure exchange (``watch/failure/exchange.py``)::

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

from minidist.watch.diagnosis.ledger import describe

FIELDS = ("collective", "op", "dtype", "count", "root", "algorithm", "label")


def signature(e: dict | None) -> tuple | None:
    """What must agree across ranks for one call (None: the rank made no such call)."""
    return None if e is None else tuple(e[k] for k in FIELDS)


def site(e: dict) -> str:
    """``bad.py:57``."""
    return f"{os.path.basename(e['file'])}:{e['line']}"


def _ranks(rs: list[int]) -> str:
    return (f"rank {rs[0]}" if len(rs) == 1 else
            "ranks " + ", ".join(map(str, rs)))


def _first_difference(stream: int, reports: dict[int, dict]) -> tuple:
    """Walk the call numbers every rank still holds, oldest first.

    Returns ``(calls, counts, first, note)``: per rank ``{seq: entry}`` and call count on the
    stream; ``first`` = ``(seq, {rank: entry or None})`` where the signatures first differ
    (None if nowhere); ``note`` = the same for the first completed call whose call sites differ
    with equal signatures.
    """
    calls = {r: {e["seq"]: e for e in rep.get("entries", []) if e["stream"] == stream}
             for r, rep in reports.items()}
    counts = {r: int(rep.get("counts", {}).get(str(stream), 0)) for r, rep in reports.items()}
    # Ring buffers may differ in depth: start at the oldest call number every rank still has.
    lo = max((min(c) if c else counts[r] + 1) for r, c in calls.items())
    hi = max(counts.values(), default=0)
    note = None
    for seq in range(lo, hi + 1):
        entry = {r: calls[r].get(seq) if seq <= counts[r] else None for r in reports}
        if len({signature(e) for e in entry.values()}) > 1:
            return calls, counts, (seq, entry), note
        sites = {site(e) for e in entry.values() if e is not None}
        done = all(e is not None and e.get("status", "ok") == "ok" for e in entry.values())
        if note is None and len(sites) > 1 and done:
            note = (seq, entry)
    return calls, counts, None, note


def _group_text(rs: list[int], e: dict | None, seq: int, first: bool, with_algorithm: bool,
                calls: dict, counts: dict, reports: dict) -> str:
    """One group of ranks at the differing call: what they called, or that they made none."""
    one = len(rs) == 1
    if e is None:
        r0 = rs[0]
        last = calls[r0].get(counts[r0])
        text = f"{_ranks(rs)} made no collective #{seq}"
        if last is not None:
            text += f" (last: #{counts[r0]}, {describe(last)} at {site(last)})"
        state = reports[r0].get("state")
        return text + (f" and {'is' if one else 'are'} {state}" if state else "")
    call = describe(e) + (f" [algorithm {e['algorithm']}]" if with_algorithm else "")
    numbered = f" as {'its' if one else 'their'} collective #{seq}" if first else ""
    return f"{_ranks(rs)} called {call}{numbered} at {site(e)}"


def diagnose(stream: int, reports: dict[int, dict], missing: dict[int, str] | None = None
             ) -> dict[str, Any]:
    """The first difference between the ranks' ledgers on ``stream`` (see module docstring).

    Args:
        stream: the stream (``tag``) of the failed collective.
        reports: rank -> its report (this rank's own included).
        missing: rank -> why it sent no report ("is dead: ...", "did not answer within 3 s").

    Returns:
        ``{"kind", "text", "seq", "groups": [{"ranks", "call", "where"}], "missing",
        "site_note"}``; ``kind`` is "mismatch" (calls differ at ``seq``), "missing" (no
        difference among the ranks that answered, and some did not) or "same" (every rank made
        the same calls: the failure is not a mismatch).
    """
    missing = dict(missing or {})
    calls, counts, first, note = _first_difference(stream, reports)
    out: dict[str, Any] = {"stream": stream, "missing": missing, "seq": None, "groups": [],
                           "site_note": None}
    parts = []
    if first is not None:
        seq, entry = first
        groups: dict = {}
        for r in sorted(entry):
            groups.setdefault(signature(entry[r]), []).append(r)
        # Smallest group first; for two ranks, rank 0 last: the same sentence on every rank.
        order = sorted(groups.values(), key=lambda rs: (len(rs), 0 in rs, rs))
        called = [sig for sig in groups if sig is not None]
        only_algorithm = len({sig[:5] + sig[6:] for sig in called}) < len(called)
        parts.append("; ".join(
            _group_text(rs, entry[rs[0]], seq, i == 0, only_algorithm, calls, counts, reports)
            for i, rs in enumerate(order)))
        out["groups"] = [{"ranks": rs, "call": describe(entry[rs[0]]) if entry[rs[0]] else None,
                          "where": site(entry[rs[0]]) if entry[rs[0]] else None}
                         for rs in order]
        out["seq"], kind = seq, "mismatch"
        parts += [f"rank {r} {missing[r]}" for r in sorted(missing)]
    else:
        kind = "missing" if missing else "same"
        parts += [f"rank {r} {missing[r]}" for r in sorted(missing)]
        e = next((calls[r].get(counts[r]) for r in reports if calls[r].get(counts[r])), None)
        if e is not None:
            out["seq"] = e["seq"]
            rs = sorted(reports)
            if missing:
                parts.append(f"{_ranks(rs)} {'is' if len(rs) == 1 else 'are'} in collective "
                             f"#{e['seq']}, {describe(e)} at {site(e)}"
                             + ("" if len(rs) == 1 else " (their calls agree)"))
            else:
                parts.append(f"every rank called {describe(e)} as collective #{e['seq']} at "
                             f"{site(e)}, with the same arguments")
    if note is not None and (first is None or note[0] < first[0]):
        parts.append(_site_note(note, counts, out))
    out["kind"] = kind
    out["text"] = "; ".join(parts) if parts else "no ledger entries to compare"
    return out


def _site_note(note: tuple, counts: dict, out: dict) -> str:
    """The note on the first completed call whose call sites differ (signatures equal)."""
    seq, entry = note
    by_site: dict = {}
    for r in sorted(entry):
        by_site.setdefault(site(entry[r]), []).append(r)
    out["site_note"] = {"seq": seq, "sites": dict(by_site)}
    where = ", ".join(f"{_ranks(rs)} at {s}" for s, rs in by_site.items())
    fewest = min(counts.values())
    short = sorted(r for r, c in counts.items() if c == fewest)
    who = f" ({_ranks(short)} made fewer calls)" if len(short) < len(counts) else ""
    return (f"note: collective #{seq} ran at different lines on different ranks ({where}) "
            f"with the same arguments, so those calls were paired; unless they are the same "
            f"call of your program, a rank skipped or added a collective there{who} and from "
            f"there on the results were wrong")
