"""Ctrl-C and SIGTERM for a driver that spends its time inside Ray's blocking calls.

``ray.wait``/``ray.get`` can absorb the KeyboardInterrupt raised while they block (a job ran to
its end, exit 0, after a SIGINT), so the signal also sets a flag the driver checks every
``POLL_S``. SIGTERM (``ray job stop``, ``scancel``, ``kill``, ``docker stop``) stops the job the
same way (``keep_sigterm`` keeps this handler across ``ray.init``, whose own aborts the driver
with a C++ stack dump and leaves its actors to die after it)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType

from trak_dist.errors import Terminated

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class CtrlC:
    """While active (main thread only), SIGINT raises KeyboardInterrupt and SIGTERM
    ``Terminated``, and either sets ``hit``; ``check()`` raises it again where Ray may have
    swallowed it. The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.hit: KeyboardInterrupt | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._note) for signum in SIGNALS}
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.hit = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        raise self.hit

    def check(self) -> None:
        """Raise the interrupt again if one arrived since entering."""
        if self.hit is not None:
            raise type(self.hit)()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()
        if type(value) is KeyboardInterrupt and isinstance(self.hit, Terminated):
            # Ray's blocking calls turn the Terminated raised inside them into a plain
            # KeyboardInterrupt; the program must still report SIGTERM
            raise Terminated from None

    def _restore(self) -> None:
        for signum, before in self._previous.items():
            # None: a handler not set from Python, which cannot be put back
            signal.signal(signum, signal.SIG_DFL if before is None else before)  # type: ignore[arg-type]
        self._previous = {}


@contextmanager
def keep_sigterm() -> Iterator[None]:
    """The process's own SIGTERM handler (``failures.reported``'s, the driver's ``CtrlC``) put
    back after ``ray.init`` and ``ray.shutdown`` (``_ray.connect``, ``_ray.shutdown``, serve's
    start). ``ray.init`` installs a handler that exits (``sys.exit(15)``), then its core worker
    one that aborts (a C++ stack dump) and leaves the actors to die after the driver;
    ``ray.shutdown`` leaves the default action. Ray's exit during the call is reported as
    SIGTERM. Not blocked meanwhile: Ray's daemons would inherit the block and ignore their own
    stop. So a SIGTERM in the ~20 ms after the core worker starts, or in the second
    ``ray.shutdown`` takes, still ends the program Ray's way (nothing committed is lost either
    way). Only a Python handler is put back: a program that chose none keeps Ray's."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    except SystemExit as e:
        if callable(before) and e.code == signal.SIGTERM:
            raise Terminated from None
        raise
    finally:
        if callable(before):
            signal.signal(signal.SIGTERM, before)
