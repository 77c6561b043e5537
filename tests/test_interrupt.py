"""Ctrl-C stops a long command at once: one line, exit 130, no worker left behind.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group, the pool's workers
included; here the command runs in its own group and the group gets the signal, as from a
terminal.  `pgspec golden verify --no-cache` printed about 65 lines of worker tracebacks and went
on (the pool started new workers for the queue)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = str(Path(sys.executable).parent / "pgspec")


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
@pytest.mark.parametrize("action", ["verify", "generate"])
def test_the_first_ctrl_c_stops_golden_at_once_with_one_line(tmp_path, action):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(PGSPEC_CACHE=str(tmp_path / "cache"), PGSPEC_JOBS="2")
    argv = [SCRIPT, "golden", action] + (["--no-cache"] if action == "verify" else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_children(proc.pid)) >= 2, "the worker processes did not start"
        time.sleep(1.0)     # the workers are evaluating cases
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert err.strip().splitlines() == [f"pgspec golden: interrupted"], err[-3000:]
    assert out == ""
    assert took < 10, f"took {took:.1f} s to stop"
    deadline = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "a worker process outlived the command"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_sigterm_ends_the_run_and_its_worker_with_one_line(tmp_path):
    """SIGTERM to pgspec (what a CI job's timeout sends, to pgspec alone) used to leave the --python
    worker running after pgspec exited; now pgspec closes it and exits 143 with one line."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.Popen([SCRIPT, "run", "--adapter", "torch", "--python", sys.executable, "--no-properties"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not _children(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _children(proc.pid)
        if not workers and proc.poll() is not None:    # pgspec ended before it started a worker: say why
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"pgspec exited {proc.returncode} before starting the worker:\n{err[-3000:]}")
        assert workers, "the worker did not start within 120 s"
        time.sleep(3.0)     # the worker has loaded the adapter and runs cases
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, (proc.returncode, err[-3000:])
    assert err.strip().splitlines()[-1] == "pgspec run: terminated", err[-3000:]
    deadline = time.monotonic() + 10
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(w) for w in workers), "the worker outlived pgspec"


def _running(pid: int) -> bool:
    """The process exists and is no zombie (a zombie has ended; its parent, gone, cannot reap it)."""
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
@pytest.mark.parametrize("where", ["sleeping", "marked"])
def test_the_first_ctrl_c_stops_check_at_once_with_one_line(tmp_path, where):
    """`pgspec check` at a size that takes seconds: Ctrl-C inside the adapter's call ("sleeping": the
    adapter's KeyboardInterrupt is no adapter error outcome) or in pgspec's own judging after the call
    returned ("marked") ends it at once, with one line and exit 130.  The adapters write a marker
    when the check calls them (tests/fixtures/interrupt_adapters.py)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    marker = tmp_path / "called"
    env.update(INTERRUPT_TEST_MARKER=str(marker), PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent / "fixtures")] + [p for p in [env.get("PYTHONPATH")] if p]))
    argv = [SCRIPT, "check", "--formula", "loss.grpo", "--shape", "16x32768", "--adapter", f"interrupt_adapters:{where}",
            "--dtype", "float32,bfloat16,float64"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), ("the check never called the adapter", proc.poll())
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
    assert err.strip().splitlines() == ["pgspec check: interrupted"], err[-3000:]
    assert "pgspec check" not in out      # no result line: the check did not go on to report
    assert took < 10, f"took {took:.1f} s to stop"
