"""Tests for sample_fc.run.callbacks: periodic actions, progress lines, verification and best.json."""
import dataclasses
import json
import logging
import math
import types

import numpy as np
import pytest

from sample_fc.run import callbacks
from sample_fc import dist
from sample_fc.run.callbacks import PeriodicCallback, ProgressLogger, VerificationRunner
from sample_fc.module import StepInfo
from sample_fc.verification import score


def info(step, loss=1.0, skipped=False, lr=0.1, global_batch=8, grad_norm=1.0, bank_lr=math.nan):
    return StepInfo(step, loss, lr, global_batch, 0.01, skipped, math.nan if skipped else grad_norm,
                    bank_lr=bank_lr)


# what fit() reports: a skipped step repeats the last completed update number
FIT_SEQUENCE = [info(1), info(2), info(2, skipped=True), info(3), info(3, skipped=True),
                info(3, skipped=True), info(4), info(5), info(6), info(6, skipped=True), info(7)]


class Recorder:
    """A logging handler that keeps its records, and a SummaryWriter stand-in."""

    def __init__(self):
        self.records, self.scalars = [], []

    def handler(self):
        recorder = self

        class Handler(logging.Handler):
            def emit(self, record):
                recorder.records.append(record)
        return Handler(logging.INFO)

    def add_scalar(self, name, value, step):
        self.scalars.append((name, value, step))


@pytest.fixture
def recorder(request):
    """(Recorder, logger) with the recorder's handler attached to a logger of this test only."""
    rec = Recorder()
    logger = logging.getLogger(f"test_callbacks.{request.node.name}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = rec.handler()
    logger.addHandler(handler)
    yield rec, logger
    logger.removeHandler(handler)


@pytest.mark.parametrize("period, expected", [(3, [3, 6]), (1, [1, 2, 3, 4, 5, 6, 7]), (7, [7]),
                                              (0, [])])
def test_periodic_callback_fires_at_multiples_only_and_never_for_skipped_steps(period, expected):
    """Test that PeriodicCallback calls its action once at each multiple of the period, not for
    the skipped steps that repeat an update number, and never when the period is 0."""
    calls = []
    callback = PeriodicCallback(period, calls.append)
    for step_info in FIT_SEQUENCE:
        callback(step_info)
    assert calls == expected


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_progress_logger_lines_mean_loss_speed_and_eta(recorder, monkeypatch):
    """Test that ProgressLogger logs at every `frequent` steps and at max_update, with the mean of
    the non-skipped losses and gradient norms since the last line, the share of those norms
    above clip_grad_norm, samples/s over the time since it, the ETA from the time per step, and
    sends loss, lr, samples/s and the norm to the writer."""
    rec, logger = recorder
    clock = FakeClock()
    monkeypatch.setattr(callbacks, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    progress = ProgressLogger(frequent=2, max_update=5, logger=logger, writer=rec, clip_grad_norm=5.0)
    timeline = [  # (seconds since start, StepInfo)
        (1.0, info(1, loss=4.0, grad_norm=9.0)),
        (4.0, info(2, loss=2.0, lr=0.5, grad_norm=3.0)),         # line: 16 samples / 4 s
        (5.0, info(2, loss=math.nan, skipped=True)),             # ignored, repeats step 2
        (6.0, info(3, loss=1.0, global_batch=8, grad_norm=5.0)),  # at the limit: not clipped
        (7.0, info(3, loss=100.0, skipped=True)),                # ignored
        (10.0, info(4, loss=3.0, lr=0.05, grad_norm=2.0, bank_lr=0.2)),  # line: 16 samples / 6 s; the bank's own lr
        (10.5, info(4, loss=math.nan, skipped=True)),            # no second line for step 4
        (11.0, info(5, loss=5.0, lr=0.05, grad_norm=6.5, bank_lr=0.05)),  # max_update: 8 samples / 1 s; bank lr = lr
    ]
    for now, step_info in timeline:
        clock.now = now
        progress(step_info)
    lines = [r.getMessage() for r in rec.records]
    assert len(lines) == 3, lines
    steps, totals, speeds, losses, lrs, bank_lrs, norms, clipped, etas = zip(*(r.args for r in rec.records))
    assert bank_lrs == ("", " (bank 0.200000)", "")          # only where the bank has an lr of its own
    assert steps == (2, 4, 5) and totals == (5, 5, 5)
    np.testing.assert_allclose(speeds, [16 / 4.0, 16 / 6.0, 8 / 1.0], rtol=1e-12)
    np.testing.assert_allclose(losses, [(4.0 + 2.0) / 2, (1.0 + 3.0) / 2, 5.0], rtol=1e-12)
    np.testing.assert_allclose(norms, [(9.0 + 3.0) / 2, (5.0 + 2.0) / 2, 6.5], rtol=1e-12)
    assert clipped == (" (clipped 50%)", " (clipped 0%)", " (clipped 100%)")
    assert lrs == (0.5, 0.05, 0.05)
    # ETA = remaining steps * seconds per step since the last line: 3 * 4/2, 1 * 6/2, 0
    assert [str(e) for e in etas] == ["0:00:06", "0:00:03", "0:00:00"]
    assert lines[0] == "step 2/5  4.0 samples/s  loss 3.0000  lr 0.500000  grad norm 6.00 (clipped 50%)  eta 0:00:06"
    assert "2.7 samples/s" in lines[1] and "loss 2.0000" in lines[1] and "eta 0:00:03" in lines[1]
    assert rec.scalars == [("loss", 3.0, 2), ("lr", 0.5, 2), ("samples_per_s", 4.0, 2), ("grad_norm", 6.0, 2),
                           ("loss", 2.0, 4), ("lr", 0.05, 4), ("samples_per_s", pytest.approx(16 / 6), 4),
                           ("grad_norm", 3.5, 4), ("bank_lr", 0.2, 4),
                           ("loss", 5.0, 5), ("lr", 0.05, 5), ("samples_per_s", 8.0, 5), ("grad_norm", 6.5, 5)]


def test_progress_logger_speed_leaves_out_checkpoints_and_verification(recorder, monkeypatch):
    """Test that samples/s does not count the time `paused()` grew by in its window (a
    checkpoint, a verification), while the ETA does: 16 samples in 10 s of which 6 paused is
    4 samples/s (not 1.6), and the next window without a pause is measured whole."""
    rec, logger = recorder
    clock, paused = FakeClock(), [0.0]
    monkeypatch.setattr(callbacks, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    progress = ProgressLogger(frequent=2, max_update=6, logger=logger, paused=lambda: paused[0])
    for now, pause, step in ((2.0, 0.0, 1), (10.0, 6.0, 2), (12.0, 6.0, 3), (14.0, 6.0, 4)):
        clock.now, paused[0] = now, pause
        progress(info(step))
    speeds, etas = [r.args[2] for r in rec.records], [str(r.args[-1]) for r in rec.records]
    np.testing.assert_allclose(speeds, [16 / 4.0, 16 / 4.0], rtol=1e-12)
    assert etas == ["0:00:20", "0:00:04"]        # 4 steps x 10 s / 2; 2 steps x 4 s / 2


def test_progress_logger_without_clipping_shows_the_norm_only(recorder):
    """Test that with clip_grad_norm 0 the line has the mean norm and no clipped share."""
    rec, logger = recorder
    progress = ProgressLogger(frequent=2, max_update=2, logger=logger)
    progress(info(1, grad_norm=100.0))
    progress(info(2, grad_norm=50.0))
    assert "grad norm 75.00  eta" in rec.records[0].getMessage()


def test_progress_logger_without_writer_logs_only_on_schedule(recorder):
    """Test that with no writer and frequent=3, lines come at steps 3, 6 and max_update 7 only."""
    rec, logger = recorder
    progress = ProgressLogger(frequent=3, max_update=7, logger=logger)
    for step_info in FIT_SEQUENCE:
        progress(step_info)
    assert [r.args[0] for r in rec.records] == [3, 6, 7]
    for record in rec.records:
        speed, eta = record.args[2], record.args[-1]
        assert speed > 0 and "samples/s" in record.getMessage() and f"eta {eta}" in record.getMessage()


# ---- verification -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def horovod():
    """Horovod in this process (world size 1, no horovodrun)."""
    dist.init()
    assert dist.size() == 1 and dist.rank() == 0


def pair_set(seed, pairs=40, size=4):
    """uint8 images (2P, size, size, 3): same pairs are one image and a slightly noisy copy."""
    rng = np.random.default_rng(seed)
    issame = np.arange(pairs) % 2 == 0
    first = rng.integers(0, 256, (pairs, size, size, 3))
    other = rng.integers(0, 256, (pairs, size, size, 3))
    noisy = np.clip(first + rng.integers(-10, 11, first.shape), 0, 255)
    second = np.where(issame[:, None, None, None], noisy, other)
    images = np.empty((2 * pairs, size, size, 3), np.uint8)
    images[0::2], images[1::2] = first, second
    return images, issame


PROJECTION = np.random.default_rng(5).standard_normal((4 * 4 * 3, 8))


def good_embed(images):
    """Deterministic embeddings that keep identity: a projection of the centred pixels."""
    return (images.reshape(len(images), -1) - 127.5) @ PROJECTION


def bad_embed(images):
    """Deterministic embeddings that scramble identity (near-chance accuracy)."""
    return np.sin(1000.0 * good_embed(images))


def test_verification_runner_scores_like_score_and_keeps_best_json(horovod, recorder, tmp_path):
    """Test that VerificationRunner's results equal verification.score on embeddings computed
    directly, and that best.json (step, mean accuracy) is rewritten only when the mean accuracy
    over the targets improves, leaving no temporary files in models_root."""
    rec, logger = recorder
    targets = {"a": pair_set(1), "b": pair_set(2)}
    expected = {fn: {name: score(fn(images).astype(np.float32), issame)
                     for name, (images, issame) in targets.items()} for fn in (good_embed, bad_embed)}
    mean = {fn: np.mean([r.accuracy for r in expected[fn].values()]) for fn in expected}
    assert mean[bad_embed] < mean[good_embed] - 0.1        # the case distinguishes the two
    best = tmp_path / "best.json"
    runner = VerificationRunner(targets, bad_embed, logger, models_root=str(tmp_path), writer=rec)

    def run(step, fn):
        runner.embed_fn = fn
        results = runner(step)
        assert set(results) == {"a", "b"}
        for name, result in results.items():
            want = dataclasses.asdict(expected[fn][name])
            assert dataclasses.asdict(result) == pytest.approx(want, rel=1e-6), name
        return json.loads(best.read_text())

    first = run(10, bad_embed)                              # anything beats "no result yet"
    assert first["step"] == 10 and first["mean_accuracy"] == pytest.approx(mean[bad_embed])
    assert first["accuracy"] == pytest.approx({n: r.accuracy for n, r in expected[bad_embed].items()})
    assert run(20, bad_embed)["step"] == 10                  # equal: not an improvement
    improved = run(30, good_embed)
    assert improved["step"] == 30 and improved["mean_accuracy"] == pytest.approx(mean[good_embed])
    assert run(40, bad_embed) == improved                    # worse: best.json untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json"]
    assert len(rec.records) == 8 and "step 40  b: accuracy" in rec.records[-1].getMessage()
    assert ("verification/a", expected[good_embed]["a"].accuracy, 30) in rec.scalars


def test_verification_runner_without_models_root_writes_nothing(horovod, recorder, tmp_path,
                                                                monkeypatch):
    """Test that without models_root the runner scores and tracks the best accuracy but writes
    no file (into the working directory or elsewhere)."""
    _, logger = recorder
    monkeypatch.chdir(tmp_path)
    targets = {"a": pair_set(3)}
    runner = VerificationRunner(targets, good_embed, logger)
    result = runner(5)["a"]
    assert result.accuracy == pytest.approx(score(good_embed(targets["a"][0]).astype(np.float32),
                                                  targets["a"][1]).accuracy)
    assert runner.best_accuracy == pytest.approx(result.accuracy)
    assert list(tmp_path.iterdir()) == []
