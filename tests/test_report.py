"""Tests for python -m sample_fc.tools.report (and tools.plots): a report from hand-written run
files, several roots, damaged files, user mistakes, and one real 2-worker run end to end."""
import base64
import json
import re
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, per_rank_tail, run_train
from sample_fc.tools import report

PROG = "python -m sample_fc.tools.report"
EVENT_KINDS = ("start", "checkpoint", "verification", "skipped", "not_learning", "stop", "end")


def write_run(root, steps=40, loss_scale=1.0, lr=0.2, damage=None):
    """A models root as a run of `steps` steps writes it (progress every 4 steps, a verification
    at 20 and 40, a skipped step, the not-learning warning, a stop at 24 and a resume from it)."""
    sys.path.insert(0, str(REPO))
    import default
    config = dict(default.config_for_run("demo"), lr=lr, run_id="r1")
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(int(loss_scale * 100))
    progress = [{"step": s, "loss": loss_scale * (9.0 - s / 10) + rng.random(), "lr": lr, "grad_norm": 3.0 + rng.random(),
                 "clipped_share": 0.25, "samples_per_s": 300 + 10 * rng.random(), "time": 1000.0 + s}
                for s in range(4, steps + 1, 4)]
    lines = [json.dumps(r) for r in progress]
    if damage:
        lines = damage(lines)
    (root / "progress.jsonl").write_text("\n".join(lines) + ("" if damage else "\n"))
    events = [{"event": "start", "step": 0, "time": 1000.0, "world_size": 2, "host": "node7", "cores": 2,
               "memory_plan": {"summary": "1.36 GB per worker"}, "sampling": {"line": "sampling: ratio 1"}},
              {"event": "skipped", "step": 9, "time": 1009.0},
              {"event": "checkpoint", "step": 20, "time": 1020.0, "path": "step-00000020", "seconds": 0.1},
              {"event": "verification", "step": 20, "time": 1021.0, "accuracy": {"demo_val": 0.71},
               "tar_at_far": {"demo_val": 0.2}, "far": 0.001},
              {"event": "stop", "step": 24, "time": 1024.0, "signal": "SIGTERM"},
              {"event": "start", "step": 24, "time": 1030.0, "world_size": 2, "host": "node7", "cores": 2},
              {"event": "not_learning", "step": 30, "time": 1031.0, "line": "not learning: ..."},
              {"event": "verification", "step": 40, "time": 1041.0, "accuracy": {"demo_val": 0.83},
               "tar_at_far": {"demo_val": 0.4}, "far": 0.001},
              {"event": "end", "step": 40, "time": 1042.0}]
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (root / "best.json").write_text(json.dumps({"step": 40, "mean_accuracy": 0.83, "accuracy": {"demo_val": 0.83}}))
    (root / "status.json").write_text(json.dumps({"state": "done", "step": steps, "run_id": "r1"}))
    (root / "verification").mkdir()
    issame = np.arange(200) % 2 == 0
    distances = np.where(issame, 1.0, 2.0) + rng.normal(0, 0.4, 200)
    np.savez(root / "verification" / "demo_val.npz", step=40, distances=distances, issame=issame)
    return progress


def final_numbers(page):
    """{(column, row label): value} from the page's final-numbers table (the data-value JSON)."""
    table = re.search(r"<table id='final-numbers'>(.*?)</table>", page, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    columns = re.findall(r"<th>(.*?)</th>", rows[0])[1:]
    numbers = {}
    for row in rows[1:]:
        label = re.match(r"<th>(.*?)</th>", row).group(1)
        cells = re.findall(r"<td(?: data-value='(.*?)')?>", row)
        for column, value in zip(columns, cells):
            numbers[column, label.replace("&#x27;", "'")] = json.loads(value.replace("&quot;", '"')) if value else None
    return numbers


def check_png(path, min_colours=20):
    """The PNG decodes at 640 x 400 (three across a 1280 px page) and is not blank; returns its RGB pixels."""
    with Image.open(path) as image:
        assert image.size == (640, 400), path
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) >= min_colours, f"{path} looks blank"
    assert (pixels.min(axis=2) < 128).mean() > 0.005, f"{path} has almost nothing drawn"
    return pixels


def has_colour(pixels, rgb, tolerance=12):
    return bool((np.abs(pixels.astype(int) - rgb).max(axis=2) <= tolerance).sum() > 30)


def test_report_of_one_run_draws_every_quantity_and_its_numbers_equal_the_run_files(tmp_path, capsys):
    """Test that one root gives report.html and a 640x400 non-blank PNG per quantity, per
    verification figure and the ROC, all inlined in the page; that the final-numbers table holds
    exactly progress.jsonl's last record, best.json and the last verification event; that the
    config table lists the key changed from the presets (lr) and no other; and that the
    events (checkpoint, stop, resume, skipped step, not-learning warning) are listed."""
    progress = write_run(tmp_path / "run_a", lr=0.3)
    assert report.main([str(tmp_path / "run_a")]) == 0
    out = tmp_path / "run_a" / "report"
    assert "wrote" in capsys.readouterr().out
    names = ["loss", "lr", "grad_norm", "clipped_share", "samples_per_s", "verification_accuracy",
             "verification_tar", "roc"]
    page = (out / "report.html").read_text()
    for name in names:
        check_png(out / f"{name}.png")
        inlined = base64.b64encode((out / f"{name}.png").read_bytes()).decode()
        assert f"data:image/png;base64,{inlined}'" in page, name
    assert page.count("<img ") == len(names) and "src='http" not in page
    numbers = final_numbers(page)
    last = progress[-1]
    for key, label in [("step", "step"), ("loss", "loss"), ("lr", "lr"), ("grad_norm", "gradient norm"),
                       ("clipped_share", "share clipped"), ("samples_per_s", "samples/s")]:
        assert numbers["run_a", label] == last[key], label
    assert numbers["run_a", "best mean accuracy"] == 0.83 and numbers["run_a", "best at step"] == 40
    assert numbers["run_a", "demo_val accuracy"] == 0.83 and numbers["run_a", "demo_val TAR@FAR=0.001"] == 0.4
    assert (numbers["run_a", "skipped steps"], numbers["run_a", "stops"], numbers["run_a", "resumes / restarts"]) == (1, 1, 1)
    assert numbers["run_a", "wall time (s)"] == 42.0
    config_rows = re.search(r"differ from the presets.*?<table>(.*?)</table>", page, re.S).group(1)
    assert re.findall(r"<tr><td>(\w+)</td>", config_rows) == ["lr"]
    for kind in ("checkpoint", "stop", "skipped", "not_learning", "end"):
        assert f"<td>{kind}</td>" in page, kind
    assert "node7, 2 cores" in page and "1.36 GB per worker" in page and "sampling: ratio 1" in page


def test_two_roots_are_overlaid_in_one_figure_per_quantity_and_one_table(tmp_path):
    """Test that two roots give one loss figure with both runs' lines (matplotlib's first two
    colours, blue and orange, both drawn) and one table with a column per root holding each
    root's own last loss; the default --out is the roots' parent's report/."""
    first = write_run(tmp_path / "run_a", loss_scale=1.0)
    second = write_run(tmp_path / "run_b", loss_scale=0.5)
    assert report.main([str(tmp_path / "run_a"), str(tmp_path / "run_b")]) == 0
    out = tmp_path / "report"
    pixels = check_png(out / "loss.png")
    assert has_colour(pixels, (31, 119, 180)) and has_colour(pixels, (255, 127, 14)), "one line per run"
    single = tmp_path / "single"
    assert report.main([str(tmp_path / "run_a"), "--out", str(single)]) == 0
    assert not has_colour(check_png(single / "loss.png"), (255, 127, 14)), "one run: one colour of line"
    numbers = final_numbers((out / "report.html").read_text())
    assert numbers["run_a", "loss"] == first[-1]["loss"] and numbers["run_b", "loss"] == second[-1]["loss"]
    assert numbers["run_b - run_a", "loss"] == pytest.approx(second[-1]["loss"] - first[-1]["loss"], abs=1e-9)
    assert numbers["run_b - run_a", "samples/s"] == pytest.approx(second[-1]["samples_per_s"]
                                                                  - first[-1]["samples_per_s"], abs=1e-9)
    assert "<th>run_a</th><th>run_b</th>" in (out / "report.html").read_text()


def test_a_progress_file_cut_mid_line_with_a_garbage_line_still_reports_and_says_so_once(tmp_path, capsys):
    """Test that progress.jsonl with a garbage line and a JSON line that is no record in the
    middle and its last line cut short (a killed writer) still gives the report of the whole
    records, with exactly one stderr line naming the 3 skipped lines."""
    def damage(lines):
        return lines[:3] + ["\x00garbage {", '{"step": "12", "loss": null}'] + lines[3:-1] + [lines[-1][:17]]
    progress = write_run(tmp_path / "run_a", damage=damage)
    assert report.main([str(tmp_path / "run_a")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"{PROG}: ") and "skipped 3 of 12 lines" in err[0] and "lines 4, 5, 12" in err[0], err
    numbers = final_numbers((tmp_path / "run_a" / "report" / "report.html").read_text())
    assert numbers["run_a", "step"] == progress[-2]["step"] and numbers["run_a", "loss"] == progress[-2]["loss"]
    check_png(tmp_path / "run_a" / "report" / "loss.png")


@pytest.mark.parametrize("make, says", [(lambda p: None, "no such directory"),
                                        (lambda p: p.mkdir(), "holds no run")])
def test_a_root_that_is_missing_or_holds_no_run_is_one_line_and_exit_2(tmp_path, capsys, make, says):
    """Test that a missing root and an empty directory end with one error line naming the root
    and exit code 2, no traceback and no report written."""
    make(tmp_path / "nothing")
    with pytest.raises(SystemExit) as ended:
        report.main([str(tmp_path / "nothing")])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{PROG}: error: {tmp_path / 'nothing'}: {says}"), err
    assert not (tmp_path / "nothing" / "report").exists()


def test_a_real_two_worker_run_records_its_events_and_its_report_matches_its_files(tiny_data, tmp_path):
    """Test that a real 2-worker run (20 steps, checkpoint and verification every 10) writes its
    start facts, checkpoints, verifications and end to events.jsonl, the latest verification's
    pairs, TensorBoard events by default, and ends with the report's command; that the report of
    it equals its progress.jsonl and best.json and draws the ROC from the saved pairs."""
    root = tmp_path / "run"
    result = run_train(root, tiny_data, "--set", "max_update=20", "--set", "ckpt_period=10",
                       "--set", "verify_period=10", "--set", "clip_grad_norm=5")
    assert result.returncode == 0, per_rank_tail(result.output)
    assert f"report: python -m sample_fc.tools.report {root}" in result.stdout
    events = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"]) for e in events] == [("start", 0), ("checkpoint", 10), ("verification", 10),
                                                         ("checkpoint", 20), ("verification", 20), ("end", 20)]
    start = events[0]
    assert start["world_size"] == 2 and start["cores"] >= 1 and "GB per worker" in start["memory_plan"]["summary"]
    assert start["sampling"]["line"].startswith("sampling: ratio")
    assert list((root / "tensorboard").glob("events.out.tfevents.*")), "TensorBoard is on by default"
    with np.load(root / "verification" / "demo_val.npz") as pairs:
        assert int(pairs["step"]) == 20 and len(pairs["distances"]) == len(pairs["issame"]) == 40
    progress = [json.loads(line) for line in (root / "progress.jsonl").read_text().splitlines()]
    assert [r["step"] for r in progress] == [4, 8, 12, 16, 20] and all("clipped_share" in r for r in progress)
    assert report.main([str(root)]) == 0
    page = (root / "report" / "report.html").read_text()
    numbers = final_numbers(page)
    assert numbers["run", "loss"] == progress[-1]["loss"] and numbers["run", "step"] == 20
    best = json.loads((root / "best.json").read_text())
    assert numbers["run", "best mean accuracy"] == best["mean_accuracy"]
    assert numbers["run", "demo_val accuracy"] == events[4]["accuracy"]["demo_val"]
    assert numbers["run", "checkpoints written"] == 2
    for name in ("loss", "lr", "grad_norm", "clipped_share", "samples_per_s", "verification_accuracy", "roc"):
        check_png(root / "report" / f"{name}.png")


def test_a_run_still_training_is_reported_as_far_as_it_got(tmp_path):
    """Test that a root with only config.json, a running status and three progress records (no
    events, verification or best.json yet) gives the step figures and the numbers so far, and no
    verification figures."""
    root = tmp_path / "young"
    progress = write_run(root)[:3]
    for name in ("events.jsonl", "best.json"):
        (root / name).unlink()
    (root / "verification" / "demo_val.npz").unlink()
    (root / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in progress))
    (root / "status.json").write_text(json.dumps({"state": "running", "step": 13}))
    assert report.main([str(root)]) == 0
    out = root / "report"
    assert sorted(p.name for p in out.glob("*.png")) == ["clipped_share.png", "grad_norm.png", "loss.png", "lr.png",
                                                          "samples_per_s.png"]
    page = (out / "report.html").read_text()
    assert final_numbers(page)["young", "loss"] == progress[-1]["loss"] and "running at step 13" in page


def test_tensorboard_without_tensorboardx_is_one_log_line_and_no_writer(tmp_path, monkeypatch, caplog):
    """Test that when tensorboardX cannot be imported, rank 0's tensorboard_writer logs one
    warning naming it and returns None (the run goes on), and other ranks are never asked."""
    import logging
    from easydict import EasyDict
    from sample_fc.run.scalar_log import tensorboard_writer
    monkeypatch.setitem(sys.modules, "tensorboardX", None)       # import tensorboardX -> ImportError
    logger = logging.getLogger("test_report.tensorboard")
    with caplog.at_level(logging.INFO, logger=logger.name):
        assert tensorboard_writer(EasyDict(tensorboard=True), 0, str(tmp_path), logger) is None
        assert tensorboard_writer(EasyDict(tensorboard=True), 1, str(tmp_path), logger) is None
    assert len(caplog.records) == 1 and "tensorboardX cannot be imported" in caplog.records[0].getMessage()
    assert not (tmp_path / "tensorboard").exists()


LAYOUT_PROBE = """<pre id='layout-probe'></pre><script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
document.getElementById('layout-probe').textContent = JSON.stringify({
  viewport: [window.innerWidth, window.innerHeight],
  headline: box(document.getElementById('headline')),
  tiles: [...document.querySelectorAll('#headline .tile')].map(t => [t.innerText, box(t)]),
  curves: [...document.querySelectorAll('#curves img')].map(box)});
</script>"""


def chromium():
    """The headless browser's command, or a skip naming the install (CI installs it and sets
    SAMPLE_FC_REQUIRE_CHROMIUM=1: there the test must run)."""
    import os
    import shutil
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        if os.environ.get("SAMPLE_FC_REQUIRE_CHROMIUM"):
            raise AssertionError("SAMPLE_FC_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
        pytest.skip("no headless Chromium here: apt-get install chromium (.ci/run installs it)")
    return [found, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,800"]


def test_the_first_screen_in_chromium_holds_the_headline_and_four_curves(tmp_path):
    """Test that the report, opened in headless Chromium at 1280 x 800, lays out as a dashboard:
    the headline (state, steps, best and last accuracy, samples/s, wall time) inside the first
    screen, then at least four curves entirely inside it, three across (the browser's own layout,
    read back from the page); and that Chromium's screenshot of that screen is not blank."""
    import subprocess
    write_run(tmp_path / "run_a", steps=400)
    assert report.main([str(tmp_path / "run_a")]) == 0
    page = (tmp_path / "run_a" / "report" / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", LAYOUT_PROBE + "</body>"))
    dumped = subprocess.run(chromium() + ["--dump-dom", probe.as_uri()], capture_output=True, text=True,
                            timeout=120)
    found = re.search(r"<pre id=\"layout-probe\">(.*?)</pre>", dumped.stdout, re.S)
    assert found, dumped.stderr[-2000:]
    layout = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    width, height = layout["viewport"]
    assert width == 1280 and 700 <= height <= 800, layout["viewport"]     # --dump-dom's window keeps ~90 px
    assert 0 <= layout["headline"][1] and layout["headline"][3] <= height, layout["headline"]
    tiles = {text.split("\n")[0]: text.split("\n")[-1] for text, _ in layout["tiles"]}
    assert tiles["state"] == "done" and tiles["steps"].startswith("400 / ")
    assert tiles["demo_val: best (step) / last"] == "0.8300 (40) / 0.8300" and "wall time" in tiles
    on_screen = [c for c in layout["curves"] if c[2] <= width and c[3] <= height and c[1] >= layout["headline"][3]]
    assert len(on_screen) >= 4, layout["curves"]
    assert len({round(c[0]) for c in layout["curves"][:3]}) == 3 and len({round(c[1]) for c in layout["curves"][:3]}) == 1
    shot = tmp_path / "first_screen.png"
    subprocess.run(chromium() + [f"--screenshot={shot}", (tmp_path / "run_a" / "report" / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    with Image.open(shot) as image:
        assert image.size == (1280, 800)
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 200        # text, tiles and curves drawn
