"""Tools for testing minidist itself: ``cluster`` builds a multi-node cluster on one machine.

    python -m minidist.testing.cluster --help
"""
