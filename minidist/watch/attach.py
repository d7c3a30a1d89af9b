"""How the watch wing attaches to the spine: observers, diagnosis and failure handling.

    import minidist.watch      # runs attach() once (the root loads it first of the wings,
                               # unless MINIDIST_WINGS leaves it out)

    group extensions   WatchExtension, for every new group (comm/group.py):
                         group.ledger and the other observers of every call (calls.py): the
                         ledger, the consistency check (debug mode), the debug log
                         group.calls.diagnose: a failed call's finding, the same on every
                         rank (failure/exchange.py on_failure)
                         the transport's poll hook: why a slow wait cannot succeed (poll)
                         farewell: the collective counts compared at destroy_process_group
                         close: the ledger written to MINIDIST_LEDGER_DUMP
    job hooks          WatchJob (comm/api.py JOB_HOOKS): a job that cannot start ends with
                       one line; Ctrl-C or an uncaught error ends every rank; a rank leaving
                       through exit tells its peers
    comm's names       minidist.comm.ledger_label, Ledger, LedgerEntry, CallStatus
    DDP                Preflight (ddp/observers.py DDP_EXTENSIONS): the run manifest every rank
                       must agree on; NonfiniteCheck (ddp/reducer.py NONFINITE_CHECK): the NaN/inf
                       check of the averaged gradients; LabelSteps (step_labels.py): each
                       step's bucket all-reduces carry the DataLoader's batch, so a rank
                       that skipped a step fails at the next; minidist.ddp.PreflightError,
                       check_manifest
    long waits         comm/waits.py NOTICE: what the TCP rendezvous says when it waits long
"""

from __future__ import annotations

import functools
from typing import Any

from minidist import ddp
from minidist.comm import api
from minidist.comm import group as group_module
from minidist.comm import waits
from minidist.logger import debug_level, get_logger
from minidist.watch.diagnosis.consistency import ConsistencyCheck
from minidist.watch.diagnosis.debug_log import DebugLog
from minidist.watch.diagnosis.ledger import (CallStatus, Ledger, LedgerEntry, dump_dir,
                                             ledger_capacity, ledger_enabled, ledger_label)
from minidist.watch.failure import interrupts, leaving, report, startup
from minidist.watch.failure.exchange import farewell, on_failure, poll
from minidist.watch.failure.policy import FailurePolicy
from minidist.watch.failure.waiting import notice_text
from minidist.watch.nonfinite import NonfiniteCheck
from minidist.watch.preflight import PreflightError, check_manifest, run_manifest
from minidist.watch.step_labels import LabelSteps

log = get_logger("minidist.comm.group")  # the logger these lines always came from


class WatchExtension:
    """This wing on one group (see the module docstring). It sets, on the group:

    ledger           the Ledger of its calls (recording unless ``MINIDIST_LEDGER=0``)
    failure_policy   what this rank does when it or a peer fails (failure/policy.py)
    farewells        peer -> its final collective counts per stream, from its farewell
    exit_codes       peer -> its exit code, if it left (failure/leaving.py)
    """

    def __init__(self, group: Any) -> None:
        self.group = group
        group.ledger = Ledger(group.rank, group.size, ledger_capacity(), ledger_enabled(),
                              group.calls)
        group.failure_policy = FailurePolicy()
        group.farewells = {}
        group.exit_codes = {}
        group.transport.poll_hook = functools.partial(poll, group)  # failure.poll
        group.calls.diagnose = self.diagnose
        if group.ledger.enabled:  # the observers of every call (calls.py), in this order
            group.calls.add(group.ledger)
        if group.check_consistency:
            group.calls.add(ConsistencyCheck(group))
        if debug_level() >= 1:
            group.calls.add(DebugLog(group))

    def diagnose(self, call: Any, error: BaseException) -> BaseException:
        """``calls.failed``'s last step: the failure diagnosis (failure.on_failure)."""
        return on_failure(self.group, call, error, call.spec.text)

    def farewell(self) -> None:
        """Compare collective counts with every rank (failure.farewell): raises
        CollectiveMismatch when a rank made fewer or more collectives than the others."""
        farewell(self.group)

    def close(self) -> None:
        """Write the ledger to ``MINIDIST_LEDGER_DUMP`` (when set)."""
        d = dump_dir()
        if d and self.group.ledger.enabled:
            try:
                self.group.ledger.dump(d)
            except OSError as e:
                log.warning("could not write the ledger to %s: %s", d, e)


def _default_group() -> Any:
    return api.get_default_group() if api.is_initialized() else None


class WatchJob(api.JobHooks):
    """This wing around the default group's life (comm/api.py ``JobHooks``)."""

    def before_launch(self) -> None:
        """Check the ``MINIDIST_*`` variables: one line for a bad one (failure/startup.py)."""
        startup.check_environment()

    def before_transport(self, info: Any) -> None:
        """Ctrl-C during the rendezvous ends the rank in one line."""
        interrupts.prepare(info.rank, info.world_size or 1)

    def start_failed(self, error: BaseException, rank: int | None) -> None:
        """A job that cannot start ends with one line per job (failure/startup.py)."""
        startup.failed(error, rank)

    def started(self, group: Any) -> None:
        """One rank's failure or Ctrl-C ends every rank; whole lines in merged output; a rank
        that exits with the group open ends the job."""
        interrupts.install(group)
        if group.size > 1:
            report.whole_lines()  # the launcher merges ranks' output: one write per line
        leaving.install(_default_group)

    def stopping(self) -> None:
        """Restore the exception hooks and the exit path."""
        interrupts.uninstall()
        leaving.uninstall()


class Preflight(ddp.observers.DDPExtension):
    """Every DistributedDataParallel: the run manifest, compared across ranks before anything
    is allocated or sent (preflight.py); a difference raises PreflightError on every rank."""

    def planned(self, model: Any, metas: list, specs: list, group: Any) -> None:
        """Build this rank's manifest and compare it with every rank's (collective)."""
        model.manifest = run_manifest(model.world_size, metas, specs, model.algorithm, group)
        if model.world_size > 1:
            check_manifest(model.manifest, "DistributedDataParallel", model.process_group)

    def built(self, model: Any) -> None:
        """Record what each bucket's all-reduce runs (after the check: it plans per rank)."""
        model.manifest["all-reduce"]["buckets"] = model.bucket_algorithms


_ATTACHED = False


def attach() -> None:
    """Register this wing's group extension and job hooks, and name its public API in
    ``minidist.comm`` (once per process)."""
    global _ATTACHED
    if _ATTACHED:
        return
    _ATTACHED = True
    group_module.GROUP_EXTENSIONS.append(WatchExtension)
    api.JOB_HOOKS.append(WatchJob())
    waits.NOTICE = (FailurePolicy.wait_notice_s, notice_text)  # a long rendezvous says so
    ddp.reducer.NONFINITE_CHECK = NonfiniteCheck  # DDP's NaN/inf check of averaged grads
    ddp.observers.DDP_EXTENSIONS.append(Preflight())
    ddp.observers.DDP_EXTENSIONS.append(LabelSteps())  # a skipped step fails at the next
    ddp_names: tuple[tuple[str, Any], ...] = (("PreflightError", PreflightError),
                                              ("check_manifest", check_manifest))
    for name, value in ddp_names:
        setattr(ddp, name, value)  # their public names, minidist.ddp.PreflightError, ...
    from minidist import comm
    for name, value in (("ledger_label", ledger_label), ("Ledger", Ledger),
                        ("LedgerEntry", LedgerEntry), ("CallStatus", CallStatus)):
        setattr(comm, name, value)


__all__ = ["WatchExtension", "WatchJob", "attach"]
