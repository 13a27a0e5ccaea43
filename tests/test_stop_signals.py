"""Tests for sample_fc.run.stop: the first signal asks for a stop, a second or the grace ends it."""
import os
import signal
import threading
import time

import pytest

from sample_fc.run.stop import SAME_STOP_S, StopSignals, signal_name, signal_number


def _signals(grace_s=10.0, clock=time.monotonic):
    aborted = []
    done = threading.Event()

    def abort(number, reason):
        aborted.append((number, reason))
        done.set()
    return StopSignals(["SIGUSR1", "TERM"], abort, grace_s, clock).install(), aborted, done


def test_the_first_signal_only_asks_and_a_second_aborts():
    """Test that the first signal is recorded without ending anything, that the same stop
    arriving again within SAME_STOP_S (a launcher passing it on) changes nothing, and that a
    second signal after that calls abort with its number and a reason naming it."""
    now = [100.0]
    before = signal.getsignal(signal.SIGTERM)
    stop, aborted, _ = _signals(clock=lambda: now[0])
    try:
        assert stop.requested == 0
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested == signal.SIGUSR1 and aborted == []
        now[0] += SAME_STOP_S - 0.1
        os.kill(os.getpid(), signal.SIGTERM)
        assert aborted == [] and stop.requested == signal.SIGUSR1
        now[0] += 0.1
        os.kill(os.getpid(), signal.SIGTERM)
        assert aborted == [(signal.SIGTERM, "a second signal (SIGTERM) during the stop")]
        assert stop.requested == signal.SIGUSR1
    finally:
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before          # given back as it was


def test_a_stop_longer_than_the_grace_aborts_and_a_finished_one_does_not():
    """Test that the grace timer calls abort after grace_s, and that finished() cancels it."""
    stop, aborted, done = _signals(grace_s=0.3)
    try:
        start = time.monotonic()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert done.wait(5) and 0.25 < time.monotonic() - start < 3
        assert aborted == [(signal.SIGUSR1, "the stop took longer than stop_grace_s=0.3 s")]
    finally:
        stop.uninstall()
    stop, aborted, done = _signals(grace_s=0.3)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        stop.finished()
        assert not done.wait(0.8) and aborted == []
    finally:
        stop.uninstall()


def test_signal_names():
    """Test that names with or without SIG resolve, and SIGKILL or a made-up name are refused."""
    assert signal_number("sigterm") == signal_number("TERM") == signal.SIGTERM
    assert signal_name(signal.SIGINT) == "SIGINT"
    for bad in ("SIGKILL", "SIGNOPE"):
        with pytest.raises(ValueError, match="not a signal a run can stop on"):
            signal_number(bad)
