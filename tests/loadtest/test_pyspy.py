"""loadtest.pyspy's reading of py-spy raw profiles: where the samples inside one call go."""

from __future__ import annotations

import gzip
from pathlib import Path

from loadtest.pyspy import inside, main

RAW = "\n".join([
    "thread (1): MainThread;loop (stub.cc:1);execute (model.py:9);Session.run (ort.py:3);0x7f00aa;cuLaunchKernel (libcuda.so) 6",
    "thread (1): MainThread;loop (stub.cc:1);execute (model.py:9);Session.run (ort.py:3);cuStreamSynchronize (libcuda.so) 2",
    "thread (1): MainThread;loop (stub.cc:1);execute (model.py:9);rows_of (runner.py:5);0x7f00bb 2",
    "thread (1): MainThread;loop (stub.cc:1);pthread_cond_wait (libc.so.6) 10",
    "not a stack line",
])


def test_the_samples_inside_a_frame_go_to_their_deepest_named_frames_and_the_frames_below(tmp_path: Path) -> None:
    raw = tmp_path / "stub.raw.gz"
    raw.write_bytes(gzip.compress(RAW.encode()))
    lines = inside(raw, "execute")
    assert lines[0] == "20 samples; 50.0% inside execute; deepest named frame, % of those:"
    # the bare address under rows_of is skipped: its samples are rows_of's
    assert lines[1:4] == [" 60.0%  cuLaunchKernel (libcuda.so)", " 20.0%  cuStreamSynchronize (libcuda.so)",
                          " 20.0%  rows_of (runner.py:5)"]
    below = lines[lines.index("frames below execute, inclusive, % of those:") + 1:]
    assert below[0] == " 80.0%  Session.run (ort.py:3)"
    assert not any("loop" in line or "execute" in line for line in below)  # only what is below the frame


def test_a_frame_no_sample_reaches_says_so(tmp_path: Path, capsys) -> None:
    raw = tmp_path / "stub.raw"
    raw.write_text(RAW)
    assert inside(raw, "tokenize") == ["20 samples, none inside tokenize"]
    assert main([str(raw)]) == 0  # without --inside: the self / inclusive summary
    assert "20 samples; self% total% frame" in capsys.readouterr().out
