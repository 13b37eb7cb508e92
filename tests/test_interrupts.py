"""Signals that land while a temporary is made or removed: the temporary still goes, and the
signal still ends the run (deployfuse.interrupts.held)."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from pathlib import Path

import pytest

from deployfuse.cli._outcome import signals_as_exceptions
from deployfuse.errors import Interrupted
from deployfuse.interrupts import held
from deployfuse.io import atomic_path, temporary_folder


def _signalling(make, signum=signal.SIGTERM):
    """`make`, then a real signal to this process before its result is returned."""

    def call(*args, **kwargs):
        made = make(*args, **kwargs)
        os.kill(os.getpid(), signum)
        return made

    return call


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_right_after_mkdtemp_still_removes_the_folder(tmp_path, monkeypatch, signum):
    monkeypatch.setattr(tempfile, "mkdtemp", _signalling(tempfile.mkdtemp, signum))
    reached = False
    with signals_as_exceptions(), pytest.raises(Interrupted) as caught:
        with temporary_folder(tmp_path, ".x."):
            reached = True
    assert caught.value.exit_code == 128 + signum
    assert not reached, "the held signal is raised as soon as the folder is made, before the block runs"
    assert list(tmp_path.iterdir()) == []


def test_a_signal_right_after_mkstemp_still_removes_the_file_and_closes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "mkstemp", _signalling(tempfile.mkstemp))
    open_fds = set(os.listdir("/proc/self/fd"))
    with signals_as_exceptions(), pytest.raises(Interrupted):
        with atomic_path(tmp_path / "out.txt") as tmp:
            tmp.write_text("never")
    assert list(tmp_path.iterdir()) == []
    assert set(os.listdir("/proc/self/fd")) <= open_fds, "mkstemp's descriptor was left open"


def test_a_signal_during_removal_waits_until_the_folder_is_gone(tmp_path, monkeypatch):
    import shutil

    removed: list[bool] = []
    rmtree = shutil.rmtree

    def signal_then_remove(path, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # inside held(): noted, not raised
        rmtree(path, *args, **kwargs)
        removed.append(not Path(path).exists())

    monkeypatch.setattr(shutil, "rmtree", signal_then_remove)
    with signals_as_exceptions(), pytest.raises(Interrupted):
        with temporary_folder(tmp_path, ".x.") as folder:
            (folder / "part").write_bytes(b"0" * 1024)
    assert removed == [True]
    assert list(tmp_path.iterdir()) == []


def test_held_raises_the_first_signal_once_when_the_outermost_block_ends():
    with signals_as_exceptions(), pytest.raises(Interrupted) as caught:
        with held():
            with held():
                os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGTERM)
            inner_done = True
    assert inner_done and caught.value.exit_code == 128 + signal.SIGHUP
    with signals_as_exceptions(), held():
        pass  # nothing pending any more


def test_held_in_another_thread_does_not_hold_the_main_threads_signals():
    entered, release = threading.Event(), threading.Event()

    def worker():
        with held():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert entered.wait(10)
        with signals_as_exceptions(), pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes of this (the main) thread
                pass
    finally:
        release.set()
        thread.join()
