"""Rank body of tests/auto/test_tune.py: which table "auto" uses in a fresh 2-rank job, and what it
runs for one small all-reduce. Prints ``RESULT {json}`` per rank."""

import json

import numpy as np

import minidist.comm as comm

group = comm.init_process_group()
x = np.full(4, group.rank + 1.0, np.float32)
name, reason = group.auto_choice(x)
comm.all_reduce(x)
print("RESULT " + json.dumps({"rank": group.rank, "source": group.auto_source(),
                              "table_source": group.auto_table()["source"], "chose": name,
                              "reason": reason, "sum": float(x[0]),
                              "ledger_reason": comm.get_ledger()[-1].reason}), flush=True)
comm.destroy_process_group()
