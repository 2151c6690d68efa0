"""Ctrl-C is noted even where a library absorbs the KeyboardInterrupt (as Ray's blocking calls
can), and the previous SIGINT handler comes back."""

import os
import signal

import pytest

from trak_dist.distributed._interrupt import CtrlC


def test_an_absorbed_interrupt_is_raised_at_the_next_check():
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as ctrl_c:
        ctrl_c.check()  # nothing yet
        try:  # a library that swallows it, as seen inside ray.wait
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs before the next line
            pytest.fail("SIGINT did not interrupt")
        except KeyboardInterrupt:
            pass
        assert ctrl_c.hit
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.check()
    assert signal.getsignal(signal.SIGINT) is before
