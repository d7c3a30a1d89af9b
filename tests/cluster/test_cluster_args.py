"""minidist.testing.cluster without building anything (runs everywhere, root or not)."""

import pytest

from minidist.testing.cluster import Cluster, parse_args, rate_bytes_per_s


def test_rates_in_tc_units():
    assert rate_bytes_per_s("1gbit") == 125e6
    assert rate_bytes_per_s("100mbit") == 12.5e6
    assert rate_bytes_per_s("10GBit") == 1.25e9
    with pytest.raises(ValueError, match="tc rate"):
        rate_bytes_per_s("fast")


def test_bad_arguments_fail_before_anything_is_built():
    with pytest.raises(ValueError, match="at least one node"):
        Cluster(nodes=0)
    with pytest.raises(ValueError, match="tc rate"):
        Cluster(nodes=2, rate="1 gigabit")
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "2"])  # no command
    with pytest.raises(SystemExit):
        parse_args(["--delay", "one:20", "--", "x.py"])


def test_command_line():
    a = parse_args(["--nodes", "3", "--rate", "1gbit", "--delay", "1:20", "--", "t.py", "-x"])
    assert (a.nodes, a.rate, a.delays, a.command) == (3, "1gbit", {1: 20.0}, ["t.py", "-x"])
    assert parse_args(["--cleanup"]).cleanup


def test_names_are_unique_per_run_and_short_enough_for_links():
    a, b = Cluster(nodes=12), Cluster(nodes=12)
    assert a.tag != b.tag and a.tag.startswith("mdc")
    names = [a.bridge] + [n.link for n in a.nodes]
    assert all(len(x) <= 15 for x in names), names  # IFNAMSIZ - 1
    assert [n.hostname for n in a.nodes[:2]] == ["node0", "node1"]
    assert [n.addr for n in a.nodes[:2]] == ["10.77.0.1", "10.77.0.2"]
