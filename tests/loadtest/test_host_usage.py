"""bench7's host figures: process groups found on real processes, and nvidia-smi dmon's SM % read as it prints it."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from loadtest.host_usage import HostUsage, group_of, sm_samples

DMON = """# gpu     sm    mem    enc    dec    jpg    ofa
# Idx      %      %      %      %      %      %
    0     81     40      0      0      0      0
    0     79     38      0      0      0      0
Failed to process sample
    0      -      -      -      -      -      -
"""


def test_sm_samples_keep_the_gpu_rows_and_skip_the_rest() -> None:
    assert sm_samples(DMON) == [81, 79]


def test_processes_are_grouped_by_their_own_or_their_ancestors_command_line() -> None:
    waiter = "import sys; sys.stdin.read()"  # lives until its stdin (the test's pipe) closes
    spawn_worker = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {waiter!r}])"
    gateway = subprocess.Popen([sys.executable, "-c", spawn_worker, "-m", "gateway"], stdin=subprocess.PIPE)
    mine = subprocess.Popen([sys.executable, "-c", waiter], stdin=subprocess.PIPE)
    try:
        parent = psutil.Process(gateway.pid)
        deadline = time.monotonic() + 60
        while not parent.children() and time.monotonic() < deadline:  # until the worker has started
            pass
        worker = parent.children()[0]
        me = psutil.Process().pid
        assert group_of(parent, me) == "gateway"
        assert group_of(worker, me) == "gateway"
        assert group_of(psutil.Process(mine.pid), me) == "load client"
    finally:
        for process in (gateway, mine):
            assert process.stdin is not None
            process.stdin.close()
            process.wait(timeout=60)


def test_a_step_counts_the_cores_of_the_processes_it_ran() -> None:
    with HostUsage("step") as usage:
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    summary = usage.summary()
    assert summary["cores load client"] > 0
    assert summary["cores host busy"] > 0
