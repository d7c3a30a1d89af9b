"""Pictures of the collectives, generated from real runs: a message recorder and its renderer.

    from minidist.viz import Recorder, record, draw_steps
    rec = record("ring", n=4)              # the library's ring on 4 thread ranks, recorded
    rec.steps(), len(rec.messages)         # (6, 24): 2(N-1) steps, N * 2(N-1) messages
    .venv/bin/python -m minidist.viz docs/img        # regenerate the pictures of docs/algorithms.md

``recorder`` wraps any Transport (a delegating subclass); ``render`` draws (matplotlib).
"""

from minidist.viz.recorder import Message, Recorder, RecordingTransport
from minidist.viz.render import draw_steps, plot_cost_model, record

__all__ = ["Message", "Recorder", "RecordingTransport", "draw_steps", "plot_cost_model", "record"]
