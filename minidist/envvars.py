"""minidist's environment variables, read in one place (docs/env_vars.md is the reference).

    from minidist.envvars import env
    timeout_s = env("MINIDIST_TIMEOUT_S")        # 300.0 when unset or empty

Every variable is declared once in ``VARIABLES`` with its parser, its default and what it
accepts. A value the parser cannot use raises ``EnvVarError`` (a ValueError) with one line that
names the variable, the value and what it accepts::

    MINIDIST_TIMEOUT_S='abc' is not valid: it accepts a positive number of seconds (default
    300). Set such a value, or unset it.                            (one line, wrapped here)

Switches (``MINIDIST_LEDGER``) accept ``1/true/yes/on`` and ``0/false/no/off`` in any case;
``MINIDIST_DEBUG`` accepts its levels ``0``, ``1``, ``2`` and the same words (on = 1). An empty
value counts as unset. Variables that hold a folder, an address or a secret take any text.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
import time
from typing import Any, Callable, Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class EnvVarError(ValueError):
    """An environment variable holds a value minidist cannot use (the message says which)."""


@dataclasses.dataclass(frozen=True)
class Variable:
    """One variable: ``parse(text)`` returns the value or raises ValueError."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    accepts: str
    default_text: str | None = None  # how the default is written, where not str(default)


def _seconds(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def _whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(text)
        return value
    return parse


def _switch(text: str) -> bool:
    low = text.lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise ValueError(text)


def _debug(text: str) -> int:
    if text in ("0", "1", "2"):
        return int(text)
    return int(_switch(text))


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.lower()
        if low not in choices:
            raise ValueError(text)
        return low
    return parse


def _tri_state(text: str) -> bool | None:
    """auto -> None (decide at run time), else a switch."""
    return None if text.lower() == "auto" else _switch(text)


def _tune(text: str) -> str:
    if text.lower() == "auto":
        return "use"
    return "run" if _switch(text) else "off"


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise ValueError(text)
    return text.upper()


def _text(text: str) -> str:
    return text


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (``all`` and ``none`` are names too)."""
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    if not names or any(not n.isidentifier() for n in names):
        raise ValueError(text)
    return names


def _writable_folder(text: str) -> str:
    """A folder that exists and is writable, or that this process could create."""
    path = os.path.abspath(os.path.expanduser(text))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(text)
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    probe = os.path.join(parent, f".minidist-probe-{os.getpid()}")
    try:  # os.access says yes to root even where mkdir fails (/proc): try it
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError:
        raise ValueError(text) from None
    return text


SWITCH = "1/true/yes/on or 0/false/no/off"
VARIABLES: dict[str, Variable] = {v.name: v for v in [
    Variable("MINIDIST_TIMEOUT_S", _seconds, 300.0, "a positive number of seconds"),
    Variable("MINIDIST_WINGS", _names, ("all",),
             "all, none, or a comma-separated list of wings (minidist/wings.py)", "all"),
    Variable("MINIDIST_DEBUG", _debug, 0, f"0, 1 or 2 ({SWITCH} mean 1 or 0)"),
    Variable("MINIDIST_LEDGER", _switch, True, SWITCH),
    Variable("MINIDIST_LEDGER_SIZE", _whole(16), 512, "a whole number of entries, at least 16"),
    Variable("MINIDIST_LEDGER_DUMP", _writable_folder, None,
             "a folder this process can write to or create (not a file)"),
    Variable("MINIDIST_CACHE_DIR", _text, None, "a folder"),
    Variable("MINIDIST_TUNE", _tune, "use",
             "1 (calibrate when no cached calibration matches; also true/yes/on), 0 (ignore "
             "the cache; also false/no/off) or auto (use a matching one, as when unset)",
             "auto"),
    Variable("MINIDIST_LOG_LEVEL", _log_level, "WARNING", "one of " + ", ".join(LOG_LEVELS)),
    Variable("MINIDIST_CUDA_AWARE_MPI", _tri_state, None,
             f"auto (ask the MPI library), 1 (pass GPU buffers to MPI) or 0 (stage through "
             f"host memory); {SWITCH} also work"),
    Variable("MINIDIST_TRACE", _writable_folder, None,
             "a folder this process can write to or create (not a file)"),
    Variable("MINIDIST_FAKE_VERSION", _text, None, "a version string (for tests)"),
    Variable("MINIDIST_DEVICE", _choice("cpu", "cuda"), "cpu", "cpu or cuda"),
    Variable("MINIDIST_KERNELS", _choice("auto", "reference"), "auto",
             "auto (compiled kernels where they work) or reference (NumPy/CuPy only)"),
    Variable("MINIDIST_AUTH_TOKEN", _text, "", "any text (a shared secret)"),
    Variable("MINIDIST_RUN_ID", _text, "", "any text (the job's name, the same on every rank)"),
    Variable("MINIDIST_RENDEZVOUS_PORT", _whole(1, 65535), None,
             "a TCP port, 1-65535, the same on every rank"),
    Variable("MINIDIST_TCP_LISTEN_ADDR", _text, None, "an address of this host"),
    Variable("MINIDIST_TCP_HANDSHAKE_S", _seconds, 5.0, "a positive number of seconds"),
    Variable("MINIDIST_TCP_MAX_MESSAGE_BYTES", _whole(1), 1 << 34,
             "a positive whole number of bytes"),
    Variable("MINIDIST_RANKS_PER_NODE", _whole(1), None,
             "a positive whole number of consecutive ranks per virtual node"),
    Variable("MINIDIST_SHM_CHUNK_BYTES", _whole(64), 64 << 20,
             "a whole number of bytes, at least 64"),
    Variable("MINIDIST_SHM_SMALL_BYTES", _whole(0), 32 << 10, "a whole number of bytes"),
    Variable("MINIDIST_SHM_PIECE_BYTES", _whole(64), 1 << 20,
             "a whole number of bytes, at least 64"),
    Variable("MINIDIST_STAGE_CHUNK_BYTES", _whole(1), None, "a positive whole number of bytes"),
    Variable("MINIDIST_CUDA_JIT", _choice("auto", "numba-cuda", "numba-cuda-mlir"), "auto",
             "auto, numba-cuda or numba-cuda-mlir"),
    Variable("MINIDIST_CUDA_LAUNCH", _choice("direct", "dispatcher"), "direct",
             "direct or dispatcher"),
    Variable("MINIDIST_LAUNCH_FD", _whole(0), None,
             "a file descriptor (set by python -m minidist.launch for its ranks, not by hand)"),
    Variable("MINIDIST_IPC_ORDER", _choice("auto", "stream", "host"), "auto",
             "auto, stream or host"),
    Variable("MINIDIST_LAUNCHER", _choice("launch", "spawn"), None,
             "launch or spawn (set by minidist's launchers)"),
]}


# MINIDIST_ names read outside this module's parsers (shell scripts, the test suite), so that
# validate() does not take them for typos.
READ_ELSEWHERE = ("MINIDIST_JOB_TIMEOUT_S",  # mpirun.sh
                  "MINIDIST_PYTHON", "MINIDIST_VENV",  # scripts/bootstrap_venv.sh
                  "MINIDIST_TEST_TORCH",  # scripts/bootstrap_venv.sh: the [torch] extra
                  "MINIDIST_EXHAUSTIVE")  # tests/kernels/test_kernels.py


def validate(environ: Mapping[str, str] | None = None) -> list[str]:
    """Check every declared variable now; return one warning per unknown ``MINIDIST_`` name.

    ``init_process_group`` calls this, so a bad value ends the job at its start, in one line,
    rather than at first use (minutes later, or never on a CPU run). An unknown name is most
    likely a typo, and its warning names the closest known variable.

        >>> validate({"MINIDIST_TIMEOUT": "10"})[0].split(";")[0]
        'MINIDIST_TIMEOUT is not a minidist variable (did you mean MINIDIST_TIMEOUT_S?)'

    Raises:
        EnvVarError: the first variable whose value is not one it accepts.
    """
    environ = os.environ if environ is None else environ
    for name in VARIABLES:
        env(name, environ)
    known = [*VARIABLES, *READ_ELSEWHERE]
    warnings = []
    for name in sorted(n for n in environ if n.startswith("MINIDIST_") and n not in known):
        close = difflib.get_close_matches(name[len("MINIDIST_"):],
                                          [k[len("MINIDIST_"):] for k in known], n=1, cutoff=0.6)
        hint = f" (did you mean MINIDIST_{close[0]}?)" if close else ""
        warnings.append(f"{name} is not a minidist variable{hint}; it is ignored. "
                        "docs/env_vars.md lists them.")
    return warnings


def quiet_rank(environ: Mapping[str, str] | None = None) -> bool:
    """True on a rank that need not say what is wrong with its environment, because another
    rank started with the same one says it: under mpiexec or srun (one environment for the
    job) every rank but 0; under ``python -m minidist.launch`` (one launcher, and one
    environment, per node) every rank but the node's first, which its launcher quotes."""
    environ = os.environ if environ is None else environ
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in environ:
            return environ[var].strip() != "0"
    if raw("MINIDIST_LAUNCH_FD", environ):
        return environ.get("LOCAL_RANK", environ.get("RANK", "0")).strip() != "0"
    return False


USAGE_EXIT_CODE = 2  # a job that cannot start as configured ends with 2, as argparse does


def raw(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The text of declared variable ``name``, stripped ("" when unset), for a reader that
    checks it later with ``env`` (at first use rather than at import)."""
    assert name in VARIABLES, name
    return (os.environ if environ is None else environ).get(name, "").strip()


def env(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The value of variable ``name`` (declared in ``VARIABLES``), parsed; its default when
    unset or empty.

        >>> env("MINIDIST_TIMEOUT_S", {"MINIDIST_TIMEOUT_S": "30"})
        30.0
        >>> env("MINIDIST_DEBUG", {"MINIDIST_DEBUG": "yes"})
        1

    Raises:
        EnvVarError: the value is not one the variable accepts (one line says what is).
    """
    var = VARIABLES[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    text = raw.strip()
    if not text:
        return var.default
    try:
        return var.parse(text)
    except ValueError:
        default = (var.default_text if var.default_text is not None else "unset"
                   if var.default is None else ("1" if var.default else "0")
                   if isinstance(var.default, bool) else f"{var.default:g}"
                   if isinstance(var.default, float) else str(var.default))
        _report_in_one_line()
        raise EnvVarError(f"{name}={raw!r} is not valid: it accepts {var.accepts} (default "
                          f"{default}). Set such a value, or unset it.") from None


def _report_in_one_line() -> None:
    """If the EnvVarError about to be raised ends the program (often at import, before any
    user code ran), print its one line, not a traceback through minidist's imports."""
    previous = sys.excepthook
    if getattr(previous, "minidist_envvars", False):
        return

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        if isinstance(exc, EnvVarError):
            if not quiet_rank():  # one line per job (per node under the launcher)
                sys.stderr.write(f"minidist: {exc}\n")
                sys.stderr.flush()
            elif raw("MINIDIST_LAUNCH_FD"):
                time.sleep(10.0)  # the launcher stops it once the node's first rank has ended
            os._exit(USAGE_EXIT_CODE)
        else:
            previous(exc_type, exc, tb)

    hook.minidist_envvars = True  # type: ignore[attr-defined]
    sys.excepthook = hook
