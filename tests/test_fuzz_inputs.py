"""Tests for bench.fuzz: damaged copies of every input format through every command
that reads it end in exit 0 or the one-line error (exit 2), never a traceback, a signal, a
hang or a changed input; and the harness sees each of those endings when they happen.

The long run (>= 2,000 cases) is not part of the suite: SAMPLE_FC_FUZZ_LONG=1 runs it here, or
`python -m bench.fuzz --cases 2000`."""
import os
import signal

import pytest

from bench.fuzz import FORMATS, Harness, build_inputs, classify, make_cases
from bench.fuzz.damage import DAMAGES, damage
from bench.fuzz.lanes import Finished, WorkerLane
from bench.fuzz.report import failures, table

SUITE_CASES, SUITE_SEED = 168, 52     # 4 cases of each (format, command) pair: 42 pairs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return build_inputs(str(tmp_path_factory.mktemp("fuzz") / "inputs"), log=lambda line: None)


@pytest.fixture(scope="module")
def suite_run(inputs, tmp_path_factory):
    """The seeded suite run: SUITE_CASES cases over every (format, command) pair, in-process."""
    cases = make_cases(inputs, SUITE_CASES, SUITE_SEED)
    harness = Harness(inputs, str(tmp_path_factory.mktemp("fuzz_cases")), timeout_s=120)
    return cases, harness.run(cases)


def described(results):
    return "\n".join(f"case {r['id']} {r['format']} {r['command']} {r['damage']}: {r['outcome']}: "
                     + " | ".join(r["stderr_tail"][-3:]) for r in results)


def test_every_damage_changes_the_bytes_and_is_reproduced_by_its_seed():
    """Test that each damage gives bytes other than the original, the same for the same seed."""
    import numpy as np
    data = bytes(range(256)) * 4
    for name in DAMAGES:
        first = damage(name, np.random.default_rng(7), data, b"other file")
        again = damage(name, np.random.default_rng(7), data, b"other file")
        assert first != data and first == again, name


def test_cases_cover_every_format_and_command_it_reads(inputs):
    """Test that the suite's cases reach every (format, command) pair the formats declare."""
    cases = make_cases(inputs, SUITE_CASES, SUITE_SEED)
    pairs = {(f.name, c) for f in FORMATS.values() for c in f.commands}
    assert {(c.format, c.command) for c in cases} == pairs
    assert all(os.path.isfile(os.path.join(inputs, c.file)) for c in cases)


@pytest.mark.parametrize("finished, changed, outcome", [
    (Finished(0, ""), [], "ok"),
    (Finished(2, "note\npython -m sample_fc.tools.verify: error: --bin x: damaged\n"), [], "usage"),
    (Finished(2, "Traceback (most recent call last):\n ...\npython -m sample_fc.tools.verify: error: x"), [],
     "traceback"),
    (Finished(2, "some other line\n"), [], "other"),
    (Finished(0, ""), ["data/train.rec"], "changed-input"),
    (Finished(-11, "", "signal"), [], "signal"),
    (Finished(-9, "", "hang"), [], "hang"),
    (Finished(1, ""), [], "other"),
])
def test_outcomes_are_classified_by_code_stderr_and_inputs(finished, changed, outcome):
    """Test that an ending is classified as the module docstring of outcomes.py says."""
    assert classify("verify", finished, changed) == outcome


def test_worker_lane_sees_a_signal_a_hang_and_goes_on_with_a_new_worker(tmp_path):
    """Test that a case killing its worker is a signal, one sleeping past its timeout a hang, and
    that the lane runs the next case in a new worker, as it runs the ordinary endings."""
    lane = WorkerLane(str(tmp_path), memory_gb=8)
    module = "bench.fuzz.selftest"
    try:
        assert lane.run(0, module, ["usage"], 60).code == 2
        raised = lane.run(1, module, ["raise"], 60)
        assert raised.code == 1 and "Traceback" in raised.stderr and "ValueError" in raised.stderr
        died = lane.run(2, module, ["segfault"], 60)
        assert (died.fate, died.code) == ("signal", -signal.SIGSEGV)
        assert lane.run(3, module, ["exit3"], 60).code == 3
        hung = lane.run(4, module, ["hang"], 3)
        assert hung.fate == "hang"
        assert lane.run(5, module, ["ok"], 60) == Finished(0, "")
        assert lane.started == 3
    finally:
        lane.close()


def test_damaged_inputs_end_in_one_line_or_success(suite_run):
    """Test that no damaged data, model, .pth, .onnx or image file ends in a traceback, a signal,
    a hang, a changed input or another exit code, in any command that reads it."""
    cases, results = suite_run
    assert len(results) == len(cases)
    found = [r for r in failures(results)
             if not FORMATS[r["format"]].checkpoint and r["command"] != "train_resume"]
    assert not found, "\n".join(table(results)) + "\n" + described(found)
    assert {r["outcome"] for r in results} >= {"ok", "usage"}


def test_damaged_checkpoints_end_in_one_line_or_success(suite_run):
    """Test that no damaged checkpoint file (with the checksums its COMPLETE records) ends in a
    traceback, a signal, a hang, a changed input or another exit code under train.py --resume or
    a tool: the resume falls back to the previous checkpoint, the tools name the file."""
    _, results = suite_run
    found = [r for r in failures(results) if FORMATS[r["format"]].checkpoint or r["command"] == "train_resume"]
    assert not found, described(found)


def test_in_process_outcomes_agree_with_real_processes(inputs, suite_run, tmp_path):
    """Test that a sample of the suite's cases, one per command, run as real processes end as
    they ended in-process (same outcome, same exit code)."""
    cases, results = suite_run
    by_id = {r["id"]: r for r in results}
    sample, seen = [], set()
    for case in cases:
        if case.command not in seen and case.format in ("params", "bin", "rec", "image", "onnx"):
            seen.add(case.command)
            sample.append(case)
    separate = Harness(inputs, str(tmp_path), timeout_s=120, subprocess_only=True).run(sample)
    for result in separate:
        expected = by_id[result["id"]]
        assert (result["outcome"], result["code"]) == (expected["outcome"], expected["code"]), \
            described([result, expected])


@pytest.mark.skipif(not os.environ.get("SAMPLE_FC_FUZZ_LONG"), reason="the long run: SAMPLE_FC_FUZZ_LONG=1")
def test_long_run(inputs, tmp_path):
    """Test that 2,000 damaged cases end in one line or success (the long run, not in the suite)."""
    results = Harness(inputs, str(tmp_path), timeout_s=120).run(make_cases(inputs, 2000, 1))
    found = [r for r in failures(results) if not FORMATS[r["format"]].checkpoint and r["command"] != "train_resume"]
    assert not found, "\n".join(table(results)) + "\n" + described(found)
