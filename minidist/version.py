"""The library version, in the lowest layer so that every layer can report it.

    from minidist.version import __version__       # also minidist.__version__

The pre-flight check (minidist/watch/preflight.py) compares it across ranks before step 0.
"""

__version__ = "0.1.0"
