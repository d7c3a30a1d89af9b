"""minidist: distributed data-parallel training written from scratch in Python.

Layers, bottom up (each imports only from the ones below it; see docs/layout.md):
xp -> tensor -> nn, optim, comm -> data -> ddp -> trainer.
"""

from minidist import xp
from minidist.log import get_logger

__version__ = "0.1.0"
