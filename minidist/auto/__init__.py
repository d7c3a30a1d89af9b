"""Wing: ``algorithm="auto"``, which all-reduce runs for a call, by rule and cost model.

    python -m minidist.tune            # measure this machine; "auto" then uses the fit

    select      the rules and the alpha-beta-gamma model over the registry's candidates
    calibrate   timing the candidates on this machine, and the result every rank agrees on
    calibration_cache  the calibration's JSON file per host, transport and world size

The planner (minidist/comm/planner.py) asks these for "auto"; an explicit algorithm name never
reaches this wing.
"""

from minidist.auto.choice import attach as _make_extension
from minidist.comm import group as _group

if _make_extension not in _group.GROUP_EXTENSIONS:
    _group.GROUP_EXTENSIONS.append(_make_extension)
