"""Fused kernels compile once per machine: Numba's disk cache, in the user's cache folder.

    from minidist.kernels import jit_cache
    module = jit_cache.loops_module(element, n_state)   # an entry's loops, cacheable (or None)
    with jit_cache.compile_guard(module.__file__, "multi_step-serial-f"):   # one compiles
        first_call_of_that_signature()
    jit_cache.stats()                     # compiles, seconds in first calls, waits: this process

Compiling the fused AdamW loops takes seconds, and without a disk cache every run (every rank
of every job) pays them again in its first optimizer step. Numba caches a function on disk when
it is decorated ``cache=True`` and lives in a real source file: the cache key is the file's
content hash, the function's bytecode, its closure's contents (pickled), the argument types and
this CPU. The loops of ``optim_cpu.py`` were closures built per entry around other compiled
functions, and a pickled dispatcher carries a random id, so their key changed every run. Here
the same loops are written out as a module of their own, with the entry's element function
imported by name::

    $MINIDIST_CACHE_DIR/kernels/            (default ~/.cache/minidist/kernels)
      fused_adam_element_2_<hash>.py        flat, multi, flat_parallel, multi_parallel
      __pycache__/fused_adam_element_2_<hash>.flat-NN.py3XX.nbi / .nbc   (Numba's index, code)

The hash covers what the compiled code depends on (the generated text, the files of the element
function, of ``optim_math.py``, ``optim_cpu.py`` and this module, the minidist and Numba
versions), so an edit or an upgrade writes a new module and compiles afresh, and never loads
stale code. The folder is the user's, so a read-only installation (site-packages) still caches.
An element function that cannot be imported by name (defined in ``__main__`` or inside a
function), or a cache folder that cannot be written, keeps the in-memory loops: they compile
in each process, as before, and ``MINIDIST_DEBUG=1`` logs why.

Processes running at once (the ranks of a job, each compiling the same loops) take turns:
``compile_guard`` holds an exclusive ``flock`` on ``kernels/.compile.lock`` around the first
call of a signature that no process has cached yet, so one rank compiles and writes the cache
while the others wait, then load it. Numba writes each file to a temporary name and renames
it, so a reader never sees half a file, but two processes adding different signatures to one
index at once could number their data files alike; the lock rules that out. A marker file
per source file, signature and kind of CPU (``marker_path``), written after the first call
succeeded, lets later runs skip the lock: they only read. The AMP kernels of ``cpu.py`` are
plain ``cache=True`` functions (Numba caches them beside that file, or in its own user-wide
folder where the package folder is read-only) and take turns the same way.

Said once per process: rank 0 logs "compiling fused kernels for this machine (once)" at INFO
when a first call compiles here or waits for another process compiling. The Trainer's epoch
line reads ``stats()`` and says when its time includes compiling.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import inspect
import os
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, NamedTuple

from minidist.logger import get_logger, rank_prefix
from minidist.user_cache import user_cache_dir
from minidist.version import __version__

log = get_logger(__name__)

__all__ = ["kernels_dir", "loops_source", "loops_module", "compile_guard", "stats", "Stats",
           "watch_compiles", "MESSAGE"]

MESSAGE = "compiling fused kernels for this machine (once)"
MODULE_PREFIX = "_minidist_"  # sys.modules names of the generated modules


class Stats(NamedTuple):
    """What this process did about compiled kernels so far (``stats()``)."""

    compiles: int        # Numba compilations of minidist's kernels in this process
    seconds: float       # time in first calls: compiling, loading the cache, waiting for a peer
    waited: int          # first calls that found another process compiling and waited for it


_lock = threading.Lock()
_compiles = 0
_seconds = 0.0
_waited = 0
_said = False
_why_not_logged: set[str] = set()


def stats() -> Stats:
    """This process's counts so far (cheap; no Numba import)."""
    return Stats(_compiles, _seconds, _waited)


def kernels_dir() -> Path:
    """``user_cache_dir("kernels")``: the generated modules and Numba's cache of them."""
    return user_cache_dir("kernels")


def _say_once() -> None:
    """Rank 0, once per process: the first time it compiles or waits for a compile."""
    global _said
    if not _said:
        _said = True
        if rank_prefix().startswith("[rank 0/"):
            log.info("%s; cached in %s", MESSAGE, kernels_dir())


# ----------------------------------------------------------------- the generated module

def loops_source(element: Any, n_state: int) -> str:
    """The text of the cacheable loops module for ``element`` (imported by module and name)
    with ``n_state`` state arrays: ``flat``/``multi`` and their ``prange`` twins."""
    from minidist.kernels import optim_math

    body = "\n".join(optim_math.update_source(n_state)) + "\n"
    columns = "\n".join(optim_math.columns_source(n_state)) + "\n"
    loops = []
    for suffix, parallel, loop_range in (("", False, "range"), ("_parallel", True, "prange")):
        jit = f'@njit(parallel={parallel}, error_model="numpy", cache=True)'
        loops.append(
            f"{jit}\n"
            f"def flat{suffix}(p, g, states, scalars):\n"
            f"    for i in {loop_range}(p.size):\n"
            f"        update(i, p, g, states, scalars)\n\n\n"
            f"{jit}\n"
            f"def multi{suffix}(base, table, scalars):\n"
            f"    for k in range(table.shape[0]):\n"
            f"        p, g, states = columns(base, table[k], table[k, table.shape[1] - 1])\n"
            f"        flat{suffix}(p, g, states, scalars)\n")
    return (f'"""Fused optimizer loops of {element.__module__}.{element.__qualname__} with '
            f'{n_state} state array(s).\n\nWritten by minidist.kernels.jit_cache (minidist '
            f'{__version__}); Numba caches their machine code in __pycache__ beside this file. '
            f'Safe to delete.\n"""\n\n'
            f"from numba import njit, prange\n\n"
            f"from {element.__module__} import {element.__qualname__} as _element\n\n"
            f'element = njit(error_model="numpy")(_element)\n\n\n'
            f'@njit(error_model="numpy")\n{body}\n\n'
            f"@njit\n{columns}\n\n" + "\n\n".join(loops))


def _importable(element: Any) -> str | None:
    """Why ``element`` cannot be imported by name by a generated module, or None."""
    module, name = getattr(element, "__module__", None), getattr(element, "__qualname__", "")
    if not module or module == "__main__" or "." in name or "<" in name:
        return f"{module}.{name} cannot be imported by name"
    if getattr(sys.modules.get(module), name, None) is not element:
        return f"{module}.{name} is not the module's attribute of that name"
    return None


def _fingerprint(text: str, element: Any) -> str:
    """A hash of the generated text and of everything its compiled code depends on."""
    import numba

    from minidist.kernels import optim_cpu, optim_math

    h = hashlib.sha256(text.encode())
    for module in (sys.modules[element.__module__], optim_math, optim_cpu, sys.modules[__name__]):
        h.update(Path(inspect.getfile(module)).read_bytes())
    h.update(f"{__version__} {numba.__version__}".encode())
    return h.hexdigest()[:16]


def _write_if_missing(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it holds it already (temp file, then rename: the
    ranks of a job write the same module at once, and none reads half of it)."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


_MODULES: dict[tuple[Any, int], ModuleType | None] = {}


def loops_module(element: Any, n_state: int) -> ModuleType | None:
    """The generated loops module of ``element`` (written to ``kernels_dir()`` if missing, and
    imported), or None when it cannot be cached (then the caller builds its loops in memory;
    the reason is logged at debug level, once)."""
    key = (element, n_state)
    if key in _MODULES:
        return _MODULES[key]
    why = _importable(element)
    module = None
    if why is None:
        text = loops_source(element, n_state)
        stem = f"fused_{element.__name__}_{n_state}_{_fingerprint(text, element)}"
        path = kernels_dir() / f"{stem}.py"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_if_missing(path, text)
        except OSError as e:
            why = f"cannot write {path} ({e}); set MINIDIST_CACHE_DIR to a writable folder"
        else:
            name = MODULE_PREFIX + stem
            module = sys.modules.get(name)
            if module is None:
                spec = importlib.util.spec_from_file_location(name, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # Numba's cache finds the module's globals here
                spec.loader.exec_module(module)
    if why is not None and why not in _why_not_logged:
        _why_not_logged.add(why)
        log.debug("fused kernels: not cached on disk (compiled in this process): %s", why)
    _MODULES[key] = module
    return module


# ----------------------------------------------------------------- first calls

@functools.lru_cache(maxsize=None)
def _machine() -> str:
    """A short hash of what Numba's cache key holds about this CPU (target triple, CPU name,
    features): a cache folder shared by machines (a home on NFS) keeps one marker per CPU."""
    try:
        from numba.core.registry import cpu_target

        magic = cpu_target.target_context.codegen().magic_tuple()
    except Exception:  # a Numba without these internals: one marker for every CPU
        return "any-cpu"
    return hashlib.sha256(repr(magic).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=None)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def marker_path(source: str, what: str) -> Path:
    """``kernels/<file>-<its content hash>.<what>.<cpu>.ok``: "the kernels of ``source``
    (a module's file) for signature ``what`` are in Numba's cache for this kind of CPU"."""
    st = os.stat(source)
    digest = _file_hash(source, st.st_mtime_ns, st.st_size)
    return kernels_dir() / f"{Path(source).stem}-{digest}.{what}.{_machine()}.ok"


@contextlib.contextmanager
def compile_guard(source: str, what: str) -> Iterator[None]:
    """Around the first call of one kernel signature (``what``, e.g. "multi_step-serial-f")
    of the Numba functions in file ``source`` (``cache=True``): it compiles, or loads from
    Numba's cache. A marker file (``marker_path``), written after the first successful call on
    this kind of CPU, says "cached": then no lock. Without it, an exclusive ``flock`` on
    ``kernels/.compile.lock`` lets one process of the machine compile at a time; one that had
    to wait finds the marker of the process it waited for, lets the lock go and loads. The
    time is added to ``stats().seconds``."""
    global _seconds, _waited
    t0 = time.perf_counter()
    try:
        marker = marker_path(source, what)
    except OSError:  # the source is gone: no marker, no lock
        marker = None
    handle = None
    if marker is not None and not marker.exists():
        try:
            import fcntl

            marker.parent.mkdir(parents=True, exist_ok=True)
            handle = open(kernels_dir() / ".compile.lock", "a+b")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another process is compiling: wait for it
                fcntl.flock(handle, fcntl.LOCK_EX)
                if marker.exists():  # it compiled this one: this epoch waited for a compile
                    with _lock:
                        _waited += 1
                    _say_once()
                    handle.close()  # loading only reads: the ranks load side by side
                    handle = None
        except (ImportError, OSError):  # no flock here, or no writable folder: unlocked
            if handle is not None:
                handle.close()
                handle = None
    try:
        yield
        if handle is not None and marker is not None:
            marker.touch()
    finally:
        if handle is not None:
            handle.close()  # closing releases the lock
        with _lock:
            _seconds += time.perf_counter() - t0


_watching = False


def watch_compiles() -> None:
    """Count (and say once) every Numba compilation of minidist's kernels in this process, by
    Numba's ``numba:compile`` event, which fires only when a function really compiles (a cache
    hit loads without it). Imports Numba: called by the kernel modules."""
    global _watching
    with _lock:
        if _watching:
            return
        _watching = True
    try:
        from numba.core import event
    except ImportError:  # a Numba without the event API: nothing counted, nothing said
        return

    class _Listener(event.Listener):
        def on_start(self, ev: Any) -> None:
            global _compiles
            data = ev.data if isinstance(ev.data, dict) else {}
            function = getattr(data.get("dispatcher"), "py_func", None)
            module = getattr(function, "__module__", "") or ""
            if module.startswith((MODULE_PREFIX, "minidist.kernels")):
                with _lock:
                    _compiles += 1
                _say_once()
                log.debug("fused kernels: compiling %s.%s (%s)", module,
                          getattr(function, "__qualname__", "?"),
                          ", ".join(map(str, data.get("args", ()))))

        def on_end(self, ev: Any) -> None:
            pass

    event.register("numba:compile", _Listener())

