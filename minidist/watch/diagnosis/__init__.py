"""Diagnosis: what each rank called, and what went wrong when the ranks disagree.

    ledger.py       every collective's entry (call number, caller's site, status): an observer
    consistency.py  debug mode: the ranks compare each call's arguments before it runs (observer)
    debug_log.py    MINIDIST_DEBUG: a line per all-reduce, auto's choice explained (observer)
    failure.py      on a failure the ranks exchange their ledgers (side channel) and all raise
                    the same finding; the poll hook of slow waits; the farewell count check
    diagnose.py     the pure part: compare the exchanged reports, name the rank that differs

It sits beside the spine, not in it: ``ProcessGroup`` (comm/group.py) shows every call to its
observers through ``comm/calls.py`` (start, end, failed) and hands failures to
``failure.on_failure``.
"""
