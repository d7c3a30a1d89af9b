"""Break the library on purpose, one small edit at a time, and check that the tests notice.

    .venv/bin/python scripts/mutate.py                    # every mutation: caught or missed
    .venv/bin/python scripts/mutate.py --list             # names, files and the tests each runs
    .venv/bin/python scripts/mutate.py reducer-launches-filling-bucket   # one (or several) by name
    .venv/bin/python scripts/mutate.py --all-failures NAME   # every failing test, not the first
    .venv/bin/python scripts/mutate.py --tests tests/tensor/test_x.py NAME  # other tests for NAME

How it works: the repository's files (tracked, and untracked ones git does not ignore) are
copied into a temporary folder once; the checkout itself is never edited. First the selected
tests run on the unbroken copy (they must pass: else a "caught" would mean nothing). Then, for
each mutation, its one edit is made in the copy, the tests listed for it run there (pytest with
this interpreter, the copy first on ``PYTHONPATH``), and the file is restored. pytest's exit
status decides: 1 (a test failed) or a timeout is "caught", 0 is "missed", anything else
(say, the edit's text is no longer in the file) is "error". The exit status is 0 only when
every mutation run was caught.

Each mutation names the tests that should notice it, so a run stays short (a few seconds to a
minute per mutation on 2 cores); when a mutation is missed, widen its test list or write the
test that is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    """One realistic bug: replace ``old`` (found exactly once in ``path``) by ``new``."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


GRAD_MATRIX = "tests/ddp/test_ddp_grad_matrix.py"
RULES = "tests/ddp/test_reducer_rules.py"
WITNESSES = "tests/test_independent_oracles.py"
THREAD_WITNESSES = "tests/ddp/test_ddp_independent_oracles.py"

MUTATIONS = [
    # --- the reducer (the three rules of its docstring, and its gradient-ready path)
    Mutation("reducer-launches-filling-bucket", "minidist/ddp/reducer.py",
             "and self.buckets[self._next_launch].state is BucketState.READY):",
             "and self.buckets[self._next_launch].state is not BucketState.EMPTY):",
             (GRAD_MATRIX + "::test_ddp_grads_match_one_process",),
             "the launch loop accepts a bucket that is still filling"),
    Mutation("reducer-loses-grad-assigned-after-forward", "minidist/ddp/reducer.py",
             "view[...] = 0 if g is None else g", "view[...] = 0",
             (GRAD_MATRIX + "::test_ddp_grads_match_one_process",),
             "a gradient assigned between forward and backward is replaced by zeros"),
    Mutation("reducer-launches-as-ready", "minidist/ddp/reducer.py",
             "        while (self._next_launch < len(self.buckets)\n"
             "               and self.buckets[self._next_launch].state is BucketState.READY):\n"
             "            b = self.buckets[self._next_launch]\n",
             "        for b in [bucket]:  # the bucket that just became ready, any index\n",
             (RULES, GRAD_MATRIX + "::test_ddp_grads_match_one_process"),
             "buckets are launched as they become ready, not in index order"),
    Mutation("reducer-last-hook-does-not-wait", "minidist/ddp/reducer.py",
             "            self._thread.wait_all()\n"
             "            if self._thread.error is not None:\n"
             "                bucket, err = self._thread.error\n",
             "            if self._thread.error is not None:\n"
             "                bucket, err = self._thread.error\n",
             (RULES,),
             "the hook of the last bucket returns without waiting for the comm thread"),
    Mutation("reducer-no-end-of-backward-check", "minidist/ddp/reducer.py",
             "                    queue_callback(self._end_of_backward)\n", "",
             (RULES,),
             "a backward that left a bucket unreduced returns normally"),
    Mutation("ddp-no-sync-syncs", "minidist/ddp/ddp.py",
             "        self.reducer.require_sync = False\n        try:",
             "        self.reducer.require_sync = old\n        try:",
             ("tests/ddp/test_ddp_local.py", GRAD_MATRIX + "::test_ddp_grads_match_one_process"),
             "no_sync() leaves gradient averaging on"),
    Mutation("ddp-grad-sync-flag-ignored", "minidist/ddp/ddp_beyond_step.py",
             "self.reducer.require_sync = bool(value)", "self.reducer.require_sync = True",
             (GRAD_MATRIX + "::test_ddp_grads_match_one_process",),
             "require_backward_grad_sync = False is ignored (every micro-step averages)"),
    Mutation("bucket-plan-ignores-first-cap", "minidist/ddp/bucket.py",
             "limit = first_bucket_cap_bytes if closed_count.get(meta.dtype, 0) == 0 "
             "else bucket_cap_bytes",
             "limit = bucket_cap_bytes",
             ("tests/ddp/test_bucket.py",),
             "the first bucket gets the big cap (torch's 1 MiB first bucket lost)"),
    # --- sampler and resume
    Mutation("sampler-load-keeps-epoch", "minidist/data/sampler.py",
             'self.set_epoch(int(state["epoch"]))', "self.set_epoch(self.epoch)",
             (WITNESSES + "::test_sampler_load_state_dict_then_iterate_gives_the_saved_order",),
             "DistributedSampler.load_state_dict keeps the current epoch"),
    Mutation("sampler-ignores-epoch", "minidist/data/sampler.py",
             "default_rng(self.seed + self.epoch)", "default_rng(self.seed)",
             (WITNESSES + "::test_loader_shuffle_follows_the_epoch",
              "tests/data/test_sampler.py"),
             "the shuffle is the same every epoch"),
    Mutation("resume-keeps-generator", "minidist/checkpoint/resume.py",
             'tensor_random.default_generator().bit_generator.state = ckpt["rng"]',
             "tensor_random.default_generator()",
             (WITNESSES + "::test_resume_restores_the_global_generator",),
             "resume does not restore the global random generator"),
    # --- AMP
    Mutation("unscale-misses-negative-inf", "minidist/kernels/reference.py",
             "return value * inv_scale, not math.isfinite(value)",
             "return value * inv_scale, value != value or value == math.inf",
             (WITNESSES + "::test_unscale_flags_negative_inf_like_numpy",
              WITNESSES + "::test_grad_scaler_skips_a_step_with_negative_inf"),
             "the unscale check misses -inf"),
    Mutation("grad-scaler-backoff-grows", "minidist/kernels/reference.py",
             "return np.float32(scale * backoff_factor), 0",
             "return np.float32(scale * growth_factor), 0",
             ("tests/kernels/test_kernels.py",),
             "an overflow grows the loss scale instead of backing off"),
    # --- autograd, layers, ZeRO-1
    Mutation("autograd-overwrites-instead-of-adding", "minidist/tensor/autograd.py",
             'xp.add(leaf._grad, g, out=leaf._grad, casting="unsafe")',
             'xp.copyto(leaf._grad, g, casting="unsafe")',
             ("tests/tensor/test_tensor_autograd.py",),
             "a second gradient contribution overwrites the first"),
    Mutation("syncbn-biased-running-var", "minidist/nn/norm.py",
             "rv[...] = (1 - m) * rv + m * (var * n / (n - 1)).astype(rv.dtype)",
             "rv[...] = (1 - m) * rv + m * var.astype(rv.dtype)",
             (THREAD_WITNESSES + "::test_sync_batchnorm_running_stats_match_numpy",),
             "BatchNorm's running variance takes the biased batch variance"),
    Mutation("zero-tail-not-averaged", "minidist/memory/zero.py",
             "        if s.split < s.numel:\n            bucket.all_reduce",
             "        if s.split < s.numel - 1:\n            bucket.all_reduce",
             (THREAD_WITNESSES + "::test_zero_tail_matches_sgd_in_numpy",),
             "ZeRO-1 leaves a one-element tail unaveraged"),
    # --- all-reduce algorithms
    Mutation("ring-all-gather-wrong-chunk", "minidist/comm/algorithms/ring.py",
             "sc, rc = (r - s) % n, (r - s - 1) % n", "sc, rc = (r - s) % n, (r - s + 1) % n",
             ("tests/comm/test_algorithms.py::test_counts_float32_sum",),
             "the ring's all-gather writes the received chunk in the wrong place"),
    Mutation("tree-drops-last-child", "minidist/comm/algorithms/tree.py",
             "        if v + mask < n:\n            incoming",
             "        if v + mask < n - 1:\n            incoming",
             ("tests/comm/test_algorithms.py::test_counts_float32_sum",),
             "the tree's reduce skips the last rank's contribution"),
    Mutation("rd-doubling-same-peer", "minidist/comm/algorithms/recursive_doubling.py",
             "        mask <<= 1\n\n\ndef rd_all_reduce",
             "        mask <<= 2\n\n\ndef rd_all_reduce",
             ("tests/comm/test_algorithms.py::test_counts_float32_sum",),
             "recursive doubling skips every other round"),
    Mutation("shm-drops-third-rank", "minidist/kernels/reduce_cpu.py",
             "        for j in range(1, len(bufs)):\n            v += bufs[j][i]",
             "        for j in range(1, min(len(bufs), 2)):\n            v += bufs[j][i]",
             ("tests/kernels/test_reduce_cpu.py", "tests/fastpath/test_shm.py"),
             "the shared-memory all-reduce drops the third rank's data"),
]


def by_name() -> dict[str, Mutation]:
    return {m.name: m for m in MUTATIONS}


def check_applies(m: Mutation, root: Path = REPO) -> str | None:
    """None when ``m.old`` occurs exactly once in its file, else why not."""
    path = root / m.path
    if not path.exists():
        return f"{m.path} does not exist"
    count = path.read_text().count(m.old)
    if count != 1:
        return (f"its text occurs {count} times in {m.path} (expected once): the code changed; "
                "update the mutation in scripts/mutate.py")
    return None


def copy_tree(dest: Path) -> None:
    """The checkout's files (tracked and untracked-not-ignored) into ``dest``."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True)
    for name in out.stdout.decode().split("\0"):
        src = REPO / name
        if name and src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def drop_bytecode(root: Path, rel: str) -> None:
    """Remove the cached bytecode of ``rel``: an edit that keeps the size within the same
    second would otherwise run the stale .pyc."""
    src = root / rel
    for pyc in (src.parent / "__pycache__").glob(src.stem + ".*.pyc"):
        pyc.unlink()


def run_pytest(root: Path, tests: list[str], env: dict, stop_first: bool,
               timeout_s: float) -> tuple[int | None, list[str], str]:
    """(exit status or None on timeout, the failing tests, the output's tail)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *tests]
    if stop_first:
        argv.append("-x")
    p = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        code: int | None = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        code = None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    failed = [m.group(1) for m in re.finditer(r"^(?:FAILED|ERROR) (\S+)", out, re.M)]
    return code, failed, out[-3000:]


def job_env(root: Path, numba_cache: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    env["NUMBA_CACHE_DIR"] = str(numba_cache)  # kernels compiled from the copy, not reused
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = "1"
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="mutations to run (default: all; see --list)")
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--all-failures", action="store_true",
                    help="run every selected test, not stop at the first failure")
    ap.add_argument("--tests", action="append", metavar="TEST",
                    help="run this test (a path or node id; repeat the flag for more) for the "
                         "chosen mutations instead of their own list")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the run on the unbroken copy")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds per pytest run (a timeout counts as caught; default 600)")
    ap.add_argument("--keep", action="store_true", help="keep the copy (its path is printed)")
    args = ap.parse_args(argv)

    known = by_name()
    if args.list:
        for m in MUTATIONS:
            stale = check_applies(m)
            print(f"{m.name:42} {m.path}{'  STALE: ' + stale if stale else ''}\n"
                  f"{'':42} {m.what}\n{'':42} tests: {' '.join(m.tests)}")
        return 0
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"mutate.py: unknown mutation(s) {unknown}; --list shows the names.",
              file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] if args.names else list(MUTATIONS)

    def tests_of(m: Mutation) -> list[str]:
        return list(args.tests) if args.tests else list(m.tests)

    tmp = Path(tempfile.mkdtemp(prefix="minidist-mutate-"))
    root = tmp / "tree"
    try:
        copy_tree(root)
        env = job_env(root, tmp / "numba")
        where = subprocess.run([sys.executable, "-c", "import minidist; print(minidist.__file__)"],
                               cwd=root, env=env, capture_output=True, text=True)
        if not where.stdout.strip().startswith(str(root)):
            print(f"mutate.py: the copy does not import its own minidist ({where.stdout}"
                  f"{where.stderr}); nothing was run.", file=sys.stderr)
            return 2
        print(f"copy of the checkout: {root}")
        if not args.no_baseline:
            union = sorted({t for m in chosen for t in tests_of(m)})
            t0 = time.monotonic()
            code, failed, tail = run_pytest(root, union, env, True, args.timeout)
            if code != 0:
                print(f"baseline: the selected tests fail on the UNBROKEN copy (exit {code}; "
                      f"{failed}); fix that first.\n{tail}")
                return 2
            print(f"baseline: the selected tests pass unbroken ({time.monotonic() - t0:.0f} s)")
        results = []
        for m in chosen:
            stale = check_applies(m, root)
            if stale:
                results.append((m, "error", 0.0, [stale]))
                print(f"error   {m.name}: {stale}")
                continue
            path = root / m.path
            original = path.read_text()
            path.write_text(original.replace(m.old, m.new))
            drop_bytecode(root, m.path)
            menv = env
            if m.path.startswith("minidist/kernels/"):  # Numba caches the compiled kernels
                menv = job_env(root, Path(tempfile.mkdtemp(prefix="numba-", dir=tmp)))
            t0 = time.monotonic()
            try:
                code, failed, tail = run_pytest(root, tests_of(m), menv,
                                                not args.all_failures, args.timeout)
            finally:
                path.write_text(original)
                drop_bytecode(root, m.path)
            took = time.monotonic() - t0
            verdict = {1: "caught", 0: "missed", None: "caught"}.get(code, "error")
            detail = ["(timed out)"] if code is None else failed
            if verdict == "error":
                detail = [f"pytest exit {code}", tail]
            results.append((m, verdict, took, detail))
            print(f"{verdict:7} {m.name} ({took:.0f} s): {m.what}")
            for line in detail:
                print(f"          {line}")
        missed = [m.name for m, v, _, _ in results if v != "caught"]
        print(f"\n{len(results) - len(missed)} of {len(results)} mutations caught" +
              (f"; not caught: {', '.join(missed)}" if missed else ""))
        return 1 if missed else 0
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
