"""The learning benchmark's bookkeeping (sample_fc/bench/compare.py): seeds it accepts, the
loss curve it averages over seeds and the accuracy line it prints. (Training both sides is
the benchmark itself, not a test.)"""
import argparse

import pytest

from sample_fc.bench.compare import accuracy_summary, mean_curve, parse_args, samples_per_s, seed_list


def test_seed_list_parses_distinct_non_negative_integers():
    assert seed_list("0,1,2") == [0, 1, 2]
    assert seed_list("7") == [7]
    for bad in ("0,x", "1,1", "-1,2", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)
    assert parse_args(["--seeds", "3,4"]).seeds == [3, 4]
    assert parse_args([]).seeds is None


def test_mean_curve_averages_each_step_over_the_runs_that_logged_it():
    curves = [[(20, 10.0), (40, 8.0)], [(20, 12.0), (40, 6.0), (60, 5.0)]]
    assert mean_curve(curves) == [(20, 11.0), (40, 7.0), (60, 5.0)]


def test_accuracy_summary_gives_each_seed_then_mean_and_spread():
    assert accuracy_summary([{"demo_val": 0.92}]) == "demo_val 0.9200"
    line = accuracy_summary([{"demo_val": 0.92}, {"demo_val": 0.90}, {"demo_val": 0.91}])
    assert line == "demo_val 0.9200 0.9000 0.9100 (mean 0.9100, spread 0.0200)"


def test_samples_per_s_is_total_samples_over_total_time_after_the_skipped_steps():
    # windows of 20 steps at a global batch of 128: 20-40 takes 10 s, 40-60 takes 30 s,
    # 60-70 takes 5 s (the window 0-20, with start-up, is skipped)
    batch = 128
    records = [{"step": 20, "samples_per_s": 1.0}, {"step": 40, "samples_per_s": 20 * batch / 10},
               {"step": 60, "samples_per_s": 20 * batch / 30}, {"step": 70, "samples_per_s": 10 * batch / 5}]
    assert samples_per_s(records, 20) == pytest.approx(50 * batch / 45)
    assert samples_per_s(records, 40) == pytest.approx(30 * batch / 35)
    assert samples_per_s(records[:1], 20) is None          # nothing after the skipped steps
