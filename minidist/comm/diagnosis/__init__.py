"""Diagnosis: what each rank called, and what went wrong when the ranks disagree.

    ledger.py    every collective's row (call number, fingerprint, caller's site, status)
    failure.py   on a failure the ranks exchange their ledgers (side channel) and all raise
                 the same finding; the poll hook of slow waits; the farewell count check
    diagnose.py  the pure part: compare the exchanged reports, name the rank that differs

It sits beside the spine, not in it: ``ProcessGroup`` (comm/group.py) calls ``Ledger.claim``/
``record`` around each collective and hands failures to ``failure.on_failure``.
"""
