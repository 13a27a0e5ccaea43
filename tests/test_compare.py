"""bench.compare (bench/compare.py): the seeds it accepts, the loss curve it averages,
the accuracy line, the samples/s of each side and the speed table, the yardstick's recipe
mapped from sample_fc's config, its refusals, and one tiny yardstick-only run end to end.
torch is never imported in this process (Horovod is): the yardstick side runs in a subprocess."""
import argparse
import os
import subprocess
import sys

import pytest
from easydict import EasyDict

from default import get_config
from bench.compare import accuracy_summary, mean_curve, parse_args, samples_per_s, seed_list, speed_table
from bench.compare_yardstick import rate_after, recipe_numbers, yardstick_recipe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compare(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "bench.compare"] + args, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_seed_list_parses_distinct_non_negative_integers():
    """Test that --seeds takes distinct integers >= 0 and rejects anything else."""
    assert seed_list("0,1,2") == [0, 1, 2]
    assert seed_list("7") == [7]
    for bad in ("0,x", "1,1", "-1,2", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            seed_list(bad)
    assert parse_args(["--seeds", "3,4"]).seeds == [3, 4]
    assert parse_args([]).seeds is None


def test_options_runs_and_torch_data():
    """Test that --runs defaults to 1 and takes integers >= 1, --torch-data defaults to rec, and
    the options of the old reference (--torch-init, --torch-wd, --torch-momentum) are gone."""
    args = parse_args([])
    assert (args.runs, args.torch_data, args.torch_clip) == (1, "rec", 5.0)
    assert parse_args(["--runs", "3", "--torch-data", "memory"]).runs == 3
    for bad in (["--runs", "0"], ["--runs", "x"], ["--torch-data", "disk"], ["--torch-init", "torch"],
                ["--torch-wd", "all"], ["--torch-momentum", "mxnet"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_mean_curve_averages_each_step_over_the_runs_that_logged_it():
    """Test that the loss at each step is averaged over the trainings that logged that step."""
    curves = [[(20, 10.0), (40, 8.0)], [(20, 12.0), (40, 6.0), (60, 5.0)]]
    assert mean_curve(curves) == [(20, 11.0), (40, 7.0), (60, 5.0)]


def test_accuracy_summary_gives_each_seed_then_mean_and_spread():
    """Test that the accuracy line lists each training's accuracy, then their mean and spread."""
    assert accuracy_summary([{"demo_val": 0.92}]) == "demo_val 0.9200"
    line = accuracy_summary([{"demo_val": 0.92}, {"demo_val": 0.90}, {"demo_val": 0.91}])
    assert line == "demo_val 0.9200 0.9000 0.9100 (mean 0.9100, spread 0.0200)"


def test_samples_per_s_is_total_samples_over_total_time_after_the_skipped_steps():
    """Test that sample_fc's samples/s is the progress windows after the skipped steps taken as
    total samples over total time."""
    # windows of 20 steps at a global batch of 128: 20-40 takes 10 s, 40-60 takes 30 s,
    # 60-70 takes 5 s (the window 0-20, with start-up, is skipped)
    batch = 128
    records = [{"step": 20, "samples_per_s": 1.0}, {"step": 40, "samples_per_s": 20 * batch / 10},
               {"step": 60, "samples_per_s": 20 * batch / 30}, {"step": 70, "samples_per_s": 10 * batch / 5}]
    assert samples_per_s(records, 20) == pytest.approx(50 * batch / 45)
    assert samples_per_s(records, 40) == pytest.approx(30 * batch / 35)
    assert samples_per_s(records[:1], 20) is None          # nothing after the skipped steps


def test_yardstick_rate_counts_only_the_steps_after_the_skipped_ones():
    """Test that the yardstick's samples/s is (steps after `skip`) x batch over the time from
    the end of step `skip` to the end of the last step, and None without such steps."""
    ends = [0.0, 5.0, 6.0, 7.0, 9.0, 10.0]            # start, then the end of steps 1..5 (step 1: start-up)
    assert rate_after(ends, 1, 32) == pytest.approx(4 * 32 / 5.0)
    assert rate_after(ends, 3, 32) == pytest.approx(2 * 32 / 3.0)
    assert rate_after(ends, 5, 32) is None and rate_after(ends[:1], 0, 32) is None


def test_speed_table_gives_each_runs_ratio_and_their_median():
    """Test that each run's row has every side's samples/s and sample_fc / each yardstick row,
    that each median is over the runs' ratios (not the ratio of medians), and that a side
    without a number has '-' and no ratio."""
    lines, (median,) = speed_table([100.0, 130.0, 90.0], [80.0, 100.0, 100.0])
    assert median == pytest.approx(1.25)                  # ratios 1.25, 1.3, 0.9
    assert lines[1].split() == ["1", "100.0", "80.0", "1.250"]
    assert lines[3].split() == ["3", "90.0", "100.0", "0.900"]
    lines, (median,) = speed_table([None, 60.0], [50.0, 40.0])
    assert lines[1].split() == ["1", "-", "50.0", "-"] and median == pytest.approx(1.5)
    assert speed_table([None], [50.0])[1] == [None]
    assert speed_table([4.961], [4.85])[0][1].split() == ["1", "4.96", "4.85", "1.023"]   # r50's few per second
    lines, medians = speed_table([100.0, 120.0], [80.0, 100.0], [125.0, None], names=("yardstick", "tuned"))
    assert lines[0].split() == ["run", "sample_fc", "yardstick", "tuned", "/", "yardstick", "/", "tuned"]
    assert lines[1].split() == ["1", "100.0", "80.0", "125.0", "1.250", "0.800"]
    assert lines[2].split() == ["2", "120.0", "100.0", "-", "1.200", "-"]
    assert medians == [pytest.approx(1.225), pytest.approx(0.8)]


def test_yardstick_recipe_is_the_demo_presets_by_hand():
    """Test that the yardstick trains the demo's recipe as default.py sets it: mbf at 32 px,
    embedding 128, 200 classes, global batch 64 x 2 = 128, lr 0.8 x 128 / 512 = 0.2, wd 5e-4,
    260 steps, CosFace (1, 0, 0.25) at s 32, SGD (the bank's lr and decay the same); with --loss
    arcface (1, 0.5, 0) at s 32; a ViT on its recipe: AdamW at 1e-3 unscaled, decay 0.1, and the
    demo's SGD lr scaled for the bank (--torch-centers bank)."""
    recipe = yardstick_recipe(EasyDict(get_config("demo", network="mbf")), 2, 1.0)
    assert recipe == {"network": "mbf", "image_size": 32, "embedding_size": 128, "classes": 200,
                      "global_batch": 128, "steps": 260, "lr": pytest.approx(0.2), "optimizer": "sgd",
                      "bank_lr": pytest.approx(0.2), "bank_wd": 5e-4, "weight_decay": 5e-4,
                      "margins": (1.0, 0.0, 0.25), "scale": 32.0, "sample_rate": 1.0, "seed": 0}
    vit = yardstick_recipe(EasyDict(get_config("demo", network="vit_t")), 2, 1.0)
    assert (vit.optimizer, vit.lr, vit.weight_decay, vit.bank_lr, vit.bank_wd) == \
        ("adamw", 0.001, 0.1, pytest.approx(0.2), 5e-4)
    arcface = yardstick_recipe(EasyDict(get_config("demo", network="r50", loss="arcface")), 4, 0.5)
    assert (arcface.network, arcface.global_batch, arcface.lr) == ("r50", 256, pytest.approx(0.4))
    assert (arcface.margins, arcface.scale, arcface.sample_rate) == ((1.0, 0.5, 0.0), 32.0, 0.5)


def test_recipe_numbers_are_sample_fcs_schedule_and_resolved_ratio():
    """Test that the yardstick's lr of each update is sample_fc's: the demo's ArcFace recipe at
    a global batch of 128 warms up over 50 steps to 0.2, then x0.1 at steps 180 and 230; and
    that sample_ratio=auto comes back as train.py's number (1.0 for 200 classes)."""
    cfg = get_config("demo", network="mbf", loss="arcface")
    cfg.sample_ratio = "auto"
    numbers = recipe_numbers(cfg, 2)
    lrs = numbers["lrs"]
    assert len(lrs) == 260
    assert lrs[0] == pytest.approx(0.2 / 50) and lrs[24] == pytest.approx(0.1) and lrs[49] == pytest.approx(0.2)
    assert lrs[178] == pytest.approx(0.2) and lrs[179] == pytest.approx(0.02) and lrs[229] == pytest.approx(0.002)
    assert numbers["sample_ratio"] == 1.0


@pytest.mark.parametrize("args,line", [
    (["--network", "mbf_small"], "compare: the yardstick has no network 'mbf_small'; arcface_torch's networks it "
                                 "has: mbf, r18, r34, r50, r100, r200, vit_t, vit_t_dp005_mask0, vit_s, "
                                 "vit_s_dp005_mask_0, vit_b, vit_b_dp005_mask_005, vit_l_dp005_mask_005 "
                                 "(--network NAME)"),
    (["--network", "mbf", "--set", "loss_m2=0.3"], "compare: loss cosface: margins m1=1.0, m2=0.3, m3=0.25"),
    (["--network", "mbf", "--loss", "curricularface"], "compare: loss_margin=curricularface: arcface_torch's "
                                                       "CombinedMarginLoss has only the combined margin")])
def test_a_recipe_the_yardstick_cannot_train_is_one_line(args, line):
    """Test that a network arcface_torch does not have, or combined margins its loss does not
    train, end compare with one line naming the choices, before anything trains."""
    result = compare(args + ["--only", "torch"], timeout=120)
    assert result.returncode == 1 and result.stderr.strip().startswith(line), result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "step" not in result.stdout


def test_a_tiny_yardstick_run_reports_loss_accuracy_and_layout(tmp_path):
    """Test that compare --only torch trains the yardstick on a tiny 16 px set read by its
    DataLoader and prints its loss rows, its held-out accuracy, its process layout and a speed
    row without a number (the run is shorter than the skipped steps)."""
    data = tmp_path / "tiny"
    subprocess.run([sys.executable, "-m", "sample_fc.tools.demo_data", "--out", str(data), "--num-identities", "20",
                    "--images-per-identity", "4", "--num-val-identities", "20", "--num-pairs", "40",
                    "--image-size", "16"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    result = compare(["--dataset", "custom", "--network", "mbf", "--set", f"rec={data / 'train.rec'}",
                      "--set", 'val_targets=["demo_val"]', "--set", "max_update=6", "--set", "batch_size=8",
                      "--set", "frequent=2", "--only", "torch", "--torch-data", "rec"])
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "global batch 16" in out and "sample rate 1" in out and "margins (1.0, 0.0, 0.25) s 32" in out
    assert "1 process x " in out and "DataLoader with 2 worker processes" in out
    assert "tuned layout: 1 process" in out and "channels-last model and batches" in out
    section = out.split("loss (mean over")[1].split("held-out")[0].splitlines()
    assert section[1].split() == ["step", "yardstick", "tuned"]
    rows = [line.split() for line in section[2:] if line.strip()]
    assert [row[0] for row in rows] == ["2", "4", "6"] and all(float(v) > 0 for row in rows for v in row[1:])
    for name in ("yardstick", "tuned"):
        accuracy = out.split(f"{name}: demo_val ")[1].split()[0]
        assert 0.0 <= float(accuracy) <= 1.0
    assert out.rstrip().splitlines()[-1].split() == ["1", "-", "-", "-", "-", "-"]


def test_sample_fc_training_seconds_come_from_the_progress_windows(tmp_path):
    """Test time_to_accuracy.sample_fc_curve on hand-written files: windows of 20 steps x 128
    samples at 256 and 128 samples/s take 10 and 20 s, so the verifications at steps 20 and 40
    sit at 10 and 30 training seconds; a verification of another target is not in the curve."""
    import json
    from bench.time_to_accuracy import sample_fc_curve
    progress = [{"step": 20, "samples_per_s": 256.0, "loss": 9.0}, {"step": 40, "samples_per_s": 128.0, "loss": 8.0}]
    events = [{"event": "start", "step": 0, "time": 1.0},
              {"event": "verification", "step": 20, "time": 2.0, "accuracy": {"val": 0.6}},
              {"event": "checkpoint", "step": 40, "time": 3.0},
              {"event": "verification", "step": 40, "time": 4.0, "accuracy": {"val": 0.7, "other": 0.1}}]
    (tmp_path / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in progress))
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
    assert sample_fc_curve(str(tmp_path), "val", 128) == [(20, 10.0, 0.6), (40, 30.0, 0.7)]


def test_time_to_accuracy_targets_the_yardsticks_mean_final_accuracy():
    """Test the report's numbers by hand: the yardstick's finals 0.80 and 0.90 (its trainings
    100 and 90 s) make the target 0.85; sample_fc reaches it at 50 and 40 s (its first
    verification at or above, not a later one): ratio (50 + 40) / (100 + 90). When one
    training of sample_fc never reaches it, no ratio, and the line says so with its best."""
    from bench.time_to_accuracy import first_reach, report_lines
    yardstick = [[(10, 40.0, 0.6), (20, 100.0, 0.80)], [(10, 40.0, 0.86), (20, 90.0, 0.90)]]
    ours = [[(10, 20.0, 0.5), (20, 50.0, 0.86), (30, 80.0, 0.84)], [(10, 20.0, 0.5), (20, 40.0, 0.87)]]
    assert first_reach(ours[0], 0.85) == (20, 50.0) and first_reach(ours[0], 0.87) is None
    lines, ratio = report_lines({"sample_fc": ours, "yardstick": yardstick}, [(0, 1), (1, 1)])
    assert "mean of 2: 0.8500" in lines[0]
    assert ratio == pytest.approx(90.0 / 190.0)
    assert lines[-1].endswith(f"sample_fc / yardstick {90.0 / 190.0:.3f}")
    ours[1] = [(10, 20.0, 0.5), (20, 40.0, 0.84)]
    lines, ratio = report_lines({"sample_fc": ours, "yardstick": yardstick}, [(0, 1), (1, 1)])
    assert ratio is None and "not reached, best 0.8400" in lines[3]
    assert lines[-1] == "  sample_fc did not reach the target in 1 of 2 trainings"


def test_eval_every_must_be_a_multiple_of_frequent():
    result = compare(["--network", "mbf", "--eval-every", "30", "--only", "torch"], timeout=120)
    assert result.returncode == 1 and "--eval-every 30 is not a multiple of the recipe's frequent=20" in result.stderr


def test_center_study_groups_trainings_by_set_and_arm(tmp_path):
    """Test that bench.center_study groups compare's --results lines by data set and arm (the
    sample_fc side's bank_momentum and its other train.py settings, and its layout when not one
    worker; arcface_torch's own modules apart), orders seeds, and averages accuracies and the
    centers' curves over seeds."""
    import json
    from bench.center_study import main

    def line(side, seed, accuracy, turn, train_args=(), data="/d/glyphs5k/train.rec", workers=1):
        return {"side": side, "seed": seed, "overrides": [f"rec={data}", f"seed={seed}", "batch_size=64"],
                "train_args": list(train_args), "arcface_torch": side != "sample_fc" or None, "np": workers,
                "accuracy": {"glyphs_val": accuracy},
                "centers": [{"step": 50, "center_norm": 1.0 + seed, "center_turn_deg": turn}]}
    none = ("--set", "bank_momentum=none")
    rows = [line("sample_fc", 2, 0.90, 0.2, none), line("sample_fc", 1, 0.80, 0.4, none),
            line("tuned", 1, 0.70, 0.1), line("sample_fc", 1, 0.60, 0.3, none + ("--set", "bank_lr=0.2")),
            line("sample_fc", 1, 0.50, 0.3, none, data="/d/glyphs20k/train.rec"),
            line("sample_fc", 1, 0.40, 0.3, none + ("--set", "embedding_scale=learned", "--set", "decay_all=true"),
                 workers=2)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([str(path), "--steps", "50"])
    table = out.getvalue().splitlines()[2:]
    assert len(table) == 5, table
    by_arm = {tuple(cell.strip() for cell in row.split("|")[1:3]): row for row in table}
    plain = by_arm[("glyphs5k", "sample_fc, centers no momentum (lr / (1 - m))")]
    assert "0.8000 (s1) / 0.9000 (s2) | 0.8500 | 2.50 / 0.300 deg" in plain, plain
    assert "0.6000 (s1)" in by_arm[("glyphs5k", "sample_fc, centers no momentum (lr / (1 - m)), bank_lr 0.2")]
    assert "0.7000 (s1)" in by_arm[("glyphs5k", "arcface_torch as it ships (arcface_torch's modules: SGD, "
                                               "momentum 0.9 on the centers)")]
    assert "0.5000 (s1)" in by_arm[("glyphs20k", "sample_fc, centers no momentum (lr / (1 - m))")]
    assert "0.4000 (s1)" in by_arm[("glyphs5k", "sample_fc, centers no momentum (lr / (1 - m)), embedding_scale "
                                               "learned, decay_all true, 2 workers x 64")]


def test_a_folder_that_is_not_arcface_torch_is_one_line(tmp_path):
    """Test that --arcface-torch (compare) and --check-against (the yardstick) naming a folder
    without arcface_torch's files end in one usage line naming the folder and the missing files."""
    (tmp_path / "backbones").mkdir()
    (tmp_path / "losses.py").write_text("")
    missing = "no backbones/__init__.py, partial_fc_v2.py, lr_scheduler.py"
    result = compare(["--arcface-torch", str(tmp_path), "--only", "torch"], timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].endswith(
        f"error: --arcface-torch {tmp_path} is not arcface_torch: {missing}"), result.stderr[-2000:]
    check = subprocess.run([sys.executable, "-m", "bench.yardstick", "--check-against", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert check.returncode == 2 and check.stderr.strip().splitlines()[-1].endswith(
        f"error: --check-against {tmp_path} is not arcface_torch: {missing}"), check.stderr[-2000:]
