"""Expected failures, told as one line: what happened, the values seen, what to do.

Shared by the CLI, the SLURM launcher and the Ray driver (never imports Ray);
``TRAK_DIST_DEBUG=1`` adds the traceback. Anything else is a bug and keeps its traceback."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from trak_dist.errors import Terminated, TrakDistError

DEBUG_ENV = "TRAK_DIST_DEBUG"
RESUME = "committed chunks are kept: rerun the same command to resume"
# boilerplate lines of torch.load's weights-only refusal that say nothing about the file
_NOISE = ("Weights only load failed", "Please file an issue", "Check the documentation")
_LAST_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\w*): (.+)$")


# the optional extras (pyproject's [project.optional-dependencies]) by the modules they bring:
# a feature whose extra is missing stops with one line naming the install, wherever the import
# happens (lazily, in a worker, in a Ray task). A new extra adds its modules here.
EXTRAS = {
    "transformers": "hf",
    "tokenizers": "hf",
    "datasets": "hf",
    "peft": "hf",
    "matplotlib": "plot",
    "faiss": "ann",
    "obstore": "s3",  # gs:// and az:// URLs too (the gcs extra is the same package)
}


def missing_extra(error: BaseException) -> str | None:
    """The line for an import of a module an extra provides that failed, else None."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    module = error.name.split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return (
        f"{module} is not installed; this needs trak_dist's {extra!r} extra: run "
        f"`pip install 'trak_dist[{extra}]'` (in a clone: `pip install '.[{extra}]'`), then rerun."
    )


def unwrap(e: BaseException) -> BaseException:
    """The exception a Ray ``RayTaskError`` carries (through nested actor calls), else ``e``."""
    rex = sys.modules.get("ray.exceptions")
    while rex is not None and isinstance(e, rex.RayTaskError):
        cause = getattr(e, "cause", None)
        if not isinstance(cause, BaseException) or cause is e:
            break
        e = cause
    return e


def gist(e: BaseException) -> str:
    """``Type: first meaningful sentence`` of an exception's message."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(_NOISE)] or lines or [""]
    text = useful[0]
    if text.endswith(":") and len(useful) > 1:
        # a heading whose detail is on the next line, e.g. torch's "Error(s) in loading
        # state_dict for Sequential:" then "size mismatch for 0.weight: …"
        text = f"{text} {useful[1]}"
    text = text.split(". ")[0].rstrip(".")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def last_error_line(text: str) -> str:
    """The last ``SomeError: message`` line of a traceback text (Ray's actor-creation errors
    and submitit's failed jobs carry the remote traceback only as text)."""
    for line in reversed(text.splitlines()):
        match = _LAST_ERROR.match(line)
        if match:
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else text


def _os_error(e: OSError) -> str:
    where = f": {e.filename}" if e.filename else ""
    if e.filename2:
        where += f" -> {e.filename2}"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        advice = (
            "This user cannot write (or read) there: choose another location (store.path=…, "
            "hydra.run.dir=…) or fix its permissions."
        )
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = f"Free space (or move store.path to a larger disk), then rerun: {RESUME}."
    elif e.errno == errno.ENOENT:
        advice = "Check that the path exists and is spelled as intended."
    else:
        advice = f"Check the path and its disk, then rerun: {RESUME}."
    what = e.strerror or type(e).__name__
    return f"{what}{where} ({type(e).__name__}, errno {e.errno}). {advice}"


def describe(e: BaseException) -> str | None:
    """One line for an expected failure; None for anything else (a bug: keep its traceback)."""
    e = unwrap(e)
    if isinstance(e, TrakDistError):
        return _one_line(str(e))
    extra = missing_extra(e)  # a feature whose optional dependencies are not installed
    if extra is not None:
        return extra
    hydra_errors = sys.modules.get("hydra.errors")
    if hydra_errors is not None and isinstance(e, hydra_errors.HydraException):
        # a bad override or config group: Hydra's own message (its cause says which value)
        cause = f" {e.__cause__}" if e.__cause__ is not None else ""
        return _one_line(f"{e}{cause}")
    if type(e).__module__.startswith("obstore"):  # an object store's, not wrapped by ours
        return f"the object store failed: {_one_line(str(e)).split(' Debug source')[0]}"
    if isinstance(e, OSError):
        return _os_error(e)
    if isinstance(e, json.JSONDecodeError):
        return (
            f"a JSON file is corrupt ({e.msg} at line {e.lineno}, column {e.colno}). If it is "
            "the store's metadata (a zarr.json under store.path), the store is damaged: restore "
            "it or featurise into a new store (store.overwrite=true)."
        )
    yaml = sys.modules.get("yaml")
    if yaml is not None and isinstance(e, yaml.YAMLError):
        return f"a YAML file is corrupt: {_one_line(str(e))}. Fix the file and rerun."
    return None


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def exit_on(e: BaseException, prog: str) -> None:
    """Print ``e`` as one line on stderr and exit with code 2 if it is an expected failure;
    otherwise return (the caller re-raises it)."""
    message = describe(e)
    if message is None:
        return
    if _debug():
        traceback.print_exception(e)
    cause = unwrap(e)
    ours = isinstance(cause, TrakDistError) or type(cause).__module__.startswith("hydra.")
    hint = "" if ours else f" ({DEBUG_ENV}=1 for the traceback)"
    from trak_dist.remote import redact  # no credential of the environment in a message

    print(f"{prog}: error: {redact(message)}{hint}", file=sys.stderr)
    raise SystemExit(2) from None


@contextmanager
def reported(prog: str, resume: str = RESUME) -> Iterator[None]:
    """Expected failures end the program with one line (exit 2); Ctrl-C and SIGTERM (where
    the program turned it into ``Terminated``) with a note on how to resume (``resume``; exit
    130 or 143, as a shell reports SIGINT or SIGTERM)."""
    on_sigterm = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminate) if on_sigterm else None
    try:
        yield
    except Terminated:
        print(f"{prog}: terminated (SIGTERM); {resume}.", file=sys.stderr)
        raise SystemExit(143) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {resume}.", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as e:
        exit_on(e, prog)
        raise
    finally:
        if on_sigterm:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated
