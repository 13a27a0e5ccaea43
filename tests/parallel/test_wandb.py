"""Test Weights & Biases as a run's second scalar log (run/scalar_log.py), offline (no network):
the scalars TensorBoard gets, from rank 0 only, one W&B run per job grouped by the run id; a
stop to the job's process group finishes the W&B run and exits 128 + 15; asked for without the
package, one line before anything is written."""
import glob
import json
import os
import re
import signal
import struct
import sys

import numpy as np
import pytest

from conftest import per_rank_tail, run_train
from test_stop import LONG, assert_stopped_with_checkpoint, finish, start, wait_for_step


def wandb_records(root):
    """(history {step: {key: value}}, the run record, exit code or None) of the one W&B run
    under `root`, read from its .wandb file with W&B's own record reader."""
    paths = glob.glob(os.path.join(root, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(paths) == 1, paths                 # one W&B run: rank 0's
    sys.modules.setdefault("torch", None)
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore
    store = datastore.DataStore()
    store.open_for_scan(paths[0])
    history, run, exit_code = {}, None, None
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {item.key: json.loads(item.value_json) for item in record.history.item}
            history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            run = record.run
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return history, run, exit_code


def tensorboard_scalars(root):
    """{step: {tag: value}} of the run's TensorBoard event files, read as TFRecords by hand."""
    from tensorboardX.proto.event_pb2 import Event
    scalars = {}
    for path in glob.glob(os.path.join(root, "tensorboard", "events.out.tfevents.*")):
        with open(path, "rb") as handle:
            data = handle.read()
        offset = 0
        while offset < len(data):           # uint64 length, uint32 crc, payload, uint32 crc
            (length,) = struct.unpack_from("<Q", data, offset)
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(event.step, {})[value.tag] = value.simple_value
    return scalars


def test_wandb_offline_gets_the_tensorboard_scalars_from_rank_0(tiny_data, tmp_path):
    """Test that `--set wandb=offline` on 2 workers writes one W&B run under the models root,
    grouped by the run id, whose history holds at every step the scalars TensorBoard holds
    (loss, lr, samples/s, grad norm, clipped share, the verification's), ends with exit 0, and
    that W&B prints nothing of its own on the job's output."""
    root = tmp_path / "run"
    result = run_train(root, tiny_data, "--set", "max_update=8", "--set", "verify_period=8", "--set", "wandb=offline")
    assert result.returncode == 0, per_rank_tail(result.output)
    history, run, exit_code = wandb_records(root)
    board = tensorboard_scalars(root)
    assert sorted(history) == sorted(board) == [4, 8], (history, board)
    for step, values in board.items():
        assert sorted(history[step]) == sorted(values), (step, history[step], values)
        for tag, value in values.items():           # TensorBoard keeps float32
            np.testing.assert_allclose(history[step][tag], value, rtol=1e-6, err_msg=tag)
    assert {"loss", "lr", "samples_per_s", "grad_norm", "verification/demo_val"} <= set(history[8])
    status = json.loads((root / "status.json").read_text())
    assert run.run_group == status["run_id"] and run.display_name == "run" and exit_code == 0
    assert not re.search(r"wandb: \S", result.output), per_rank_tail(result.output)


def test_a_stop_finishes_the_wandb_run_and_exits_as_a_stop(tiny_data, tmp_path):
    """Test that SIGTERM to the job's process group (which horovodrun passes on to every process
    a worker started, W&B's service among them) stops the run as without W&B (exit 143, the
    stop's checkpoint) and the W&B run is finished: exit record, every progress line's scalars."""
    root = tmp_path / "stopped"
    job = start(root, tiny_data, *LONG, "--set", "wandb=offline")
    wait_for_step(job, root, 8)
    os.killpg(job.pid, signal.SIGTERM)
    assert_stopped_with_checkpoint(root, *finish(job))
    history, _, exit_code = wandb_records(root)
    progress = [json.loads(line) for line in (root / "progress.jsonl").read_text().splitlines()]
    assert exit_code == 0 and sorted(history) == [line["step"] for line in progress]
    assert [history[line["step"]]["loss"] for line in progress] == pytest.approx([line["loss"] for line in progress])


def test_wandb_without_its_package_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    """Test that wandb=offline where the package is not installed is refused in one line naming
    the setting and the install command (scalar_log.check_available, called by open_run)."""
    import importlib.util
    from easydict import EasyDict
    from sample_fc.errors import UsageError
    from sample_fc.run import scalar_log
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UsageError) as error:
        scalar_log.check_available(EasyDict(wandb="offline"))
    assert str(error.value) == ("wandb=offline needs the wandb package, which is not installed: pip install "
                                "wandb==0.16.6 (or --set wandb=off)")
    scalar_log.check_available(EasyDict(wandb="off"))
