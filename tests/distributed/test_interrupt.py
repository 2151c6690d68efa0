"""Ctrl-C and SIGTERM are noted even where a library absorbs the KeyboardInterrupt (as Ray's
blocking calls can), SIGTERM stays SIGTERM, and the previous handlers come back."""

import os
import signal

import pytest

from trak_dist.distributed._interrupt import CtrlC
from trak_dist.errors import Terminated


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


def test_sigterm_is_an_interrupt_the_program_can_tell_apart():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), CtrlC() as ctrl_c:
        try:  # absorbed, then raised again at the next check
            os.kill(os.getpid(), signal.SIGTERM)
            pytest.fail("SIGTERM did not interrupt")
        except KeyboardInterrupt as e:
            assert isinstance(e, Terminated)
        ctrl_c.check()
    assert signal.getsignal(signal.SIGTERM) is before
    # Ray's blocking calls raise a plain KeyboardInterrupt for the Terminated raised inside
    # them: leaving the context, it is SIGTERM again
    with pytest.raises(Terminated), CtrlC():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Terminated:
            raise KeyboardInterrupt from None
    # Ctrl-C stays Ctrl-C
    with pytest.raises(KeyboardInterrupt) as e, CtrlC():
        os.kill(os.getpid(), signal.SIGINT)
    assert type(e.value) is KeyboardInterrupt
