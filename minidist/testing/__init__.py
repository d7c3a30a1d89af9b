"""Tools for testing minidist itself: ``cluster`` builds a multi-node cluster on one machine
(from ``netns``'s namespaces; ``node_process``: a node and a command running on it).

    python -m minidist.testing.cluster --help
"""
