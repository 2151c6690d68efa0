"""Ctrl-C for a driver that spends its time inside Ray's blocking calls.

``ray.wait``/``ray.get`` can absorb the KeyboardInterrupt raised while they block (a job ran to
its end, exit 0, after a SIGINT), so Ctrl-C also sets a flag the driver checks every ``POLL_S``."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType


class CtrlC:
    """While active (main thread only), SIGINT sets ``hit`` and raises KeyboardInterrupt;
    ``check()`` raises it again where Ray may have swallowed it. The previous handler comes back
    on exit."""

    def __init__(self) -> None:
        self.hit = False
        self._previous: object = None
        self._active = False

    def __enter__(self) -> CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._note)
            self._active = True
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.hit = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed since entering."""
        if self.hit:
            raise KeyboardInterrupt

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._active:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._active = False
