"""Tests for the checksums of a checkpoint's files (sample_fc/checkpoint/checksums.py,
layout.verify_files): damage in any file is found and named, by a resume (which then goes back
to the previous checkpoint), by resume.saved_config and by the tools; checkpoints saved before
checksums still resume. One process, a tiny model: seconds."""
import json
import os
import re
import shutil
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import pytest

from sample_fc.run import resume
from sample_fc.checkpoint import check_sound, list_checkpoints, save_checkpoint, verify_files
from sample_fc.errors import UsageError
from sample_fc.tools import model_io
from test_checkpoint import CLASSES, DATA_SHAPE, build, horovod, train_state  # noqa: F401 (a fixture)

SIDE = DATA_SHAPE[1]
FILE_KINDS = ["model-symbol.json", "model-0002.params", "optimizer.params", "bank-rank0.json",
              "bank-rank0.weight.npy", "bank-rank0.momentum.npy", "bank-rank0.momentum_scale.npy",
              "rank0.json", "aux-rank0.params", "state.json"]


def config(marker=0):
    """The saved config check_sound reads (an int8 momentum bank: every kind of shard file)."""
    return {"num_classes": CLASSES, "embedding_size": 6, "bank_dtype": "float32", "bank_momentum": "int8",
            "network": "fc", "marker": marker}


@pytest.fixture(scope="module")
def saved_root(horovod, tmp_path_factory):
    """(models root, symbol) holding checkpoints of steps 1 and 2 of a tiny run; tests damage
    copies of it (see copy_root)."""
    root = str(tmp_path_factory.mktemp("checksummed"))
    module, symbol, data_iter = build(seed=1, bank_momentum="int8")
    for step in (1, 2):
        assert not module.step(data_iter.next())[1]
        save_checkpoint(root, step, module, symbol, data_iter, dict(train_state(), config=config(step)), keep=2)
    return root, symbol


def copy_root(saved_root, tmp_path):
    """A fresh copy of the saved models root: (root, its step-1 and step-2 checkpoints)."""
    root = str(tmp_path / "models")
    shutil.copytree(saved_root[0], root)
    return root, os.path.join(root, "step-00000001"), os.path.join(root, "step-00000002")


def flip_byte(path, offset):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([value ^ 0x5A]))


def cut(path, size):
    with open(path, "r+b") as handle:
        handle.truncate(size)


def test_complete_records_every_file_of_every_kind(saved_root):
    """Test that COMPLETE records exactly the checkpoint's other files (each kind of the layout,
    the int8 bank's included), each with its size and a 16-digit xxh3_64."""
    with open(os.path.join(saved_root[0], "step-00000002", "COMPLETE")) as handle:
        record = json.load(handle)
    assert record["step"] == 2 and sorted(record["files"]) == sorted(FILE_KINDS)
    for name, entry in record["files"].items():
        assert entry["bytes"] == os.path.getsize(os.path.join(saved_root[0], "step-00000002", name)) > 0
        assert re.fullmatch(r"[0-9a-f]{16}", entry["xxh3_64"]), entry


@pytest.mark.parametrize("name", FILE_KINDS)
def test_a_flipped_byte_anywhere_in_any_file_is_named(saved_root, tmp_path, name):
    """Test that one byte flipped at each of 3 seeded random offsets of a file (its header, its
    data: wherever it falls) makes check_sound raise 'checkpoint <dir> is damaged: <file> fails
    its xxh3_64 checksum', and that the checkpoint passes again once the byte is restored."""
    _, _, checkpoint = copy_root(saved_root, tmp_path)
    path = os.path.join(checkpoint, name)
    offsets = np.random.default_rng(sum(map(ord, name))).integers(0, os.path.getsize(path), 3)
    for offset in offsets:
        flip_byte(path, int(offset))
        with pytest.raises(UsageError) as raised:
            check_sound(checkpoint, saved_root[1], SIDE, "fc")
        assert str(raised.value) == f"checkpoint {checkpoint} is damaged: {name} fails its xxh3_64 checksum " \
                                    f"(its bytes changed after it was written)", offset
        flip_byte(path, int(offset))
        assert check_sound(checkpoint, saved_root[1], SIDE, "fc")["step"] == 2


@pytest.mark.parametrize("name", ["model-0002.params", "bank-rank0.weight.npy", "rank0.json"])
def test_a_truncated_lengthened_or_missing_file_is_named(saved_root, tmp_path, name):
    """Test that a file one byte short, one byte longer, or gone is named with its size and
    the size it was written with, before any file is hashed."""
    _, _, checkpoint = copy_root(saved_root, tmp_path)
    path = os.path.join(checkpoint, name)
    size = os.path.getsize(path)
    cut(path, size - 1)
    with pytest.raises(UsageError, match=re.escape(f"is damaged: {name} is truncated ({size - 1} bytes, "
                                                   f"{size} when written)")):
        check_sound(checkpoint, saved_root[1], SIDE, "fc")
    with open(path, "ab") as handle:
        handle.write(b"\0\0")
    with pytest.raises(UsageError, match=re.escape(f"is damaged: {name} has {size + 1} bytes, {size} when written")):
        verify_files(checkpoint)
    os.remove(path)
    with pytest.raises(UsageError, match=re.escape(f"is damaged: {name} is missing")):
        verify_files(checkpoint)


def test_a_damaged_newest_checkpoint_is_passed_over_with_one_warning(saved_root, tmp_path):
    """Test that resume.choose over a models root whose newest checkpoint has one flipped byte in
    its bank rows takes the previous checkpoint with exactly one warning naming the file, and
    that the same checkpoint named directly is an error naming it (no going back)."""
    root, previous, newest = copy_root(saved_root, tmp_path)
    flip_byte(os.path.join(newest, "bank-rank0.weight.npy"), os.path.getsize(os.path.join(newest, "bank-rank0.weight.npy")) - 3)
    warnings = []
    chosen, state = resume.choose(root, saved_root[1], SIDE, "fc", warnings.append)
    assert (chosen, state["step"]) == (previous, 1)
    assert warnings == [f"checkpoint {newest} is damaged: bank-rank0.weight.npy fails its xxh3_64 checksum (its "
                        f"bytes changed after it was written); trying the previous complete checkpoint"]
    with pytest.raises(UsageError, match=re.escape(f"{newest} is damaged: bank-rank0.weight.npy fails")):
        resume.choose(newest, saved_root[1], SIDE, "fc", warnings.append)


def test_a_damaged_state_json_gives_the_previous_checkpoints_config(saved_root, tmp_path):
    """Test that resume.saved_config passes over a newest checkpoint whose state.json still parses
    but changed (a digit of its config) and returns the previous checkpoint's config; named
    directly, that checkpoint is an error naming state.json."""
    root, _, newest = copy_root(saved_root, tmp_path)
    path = os.path.join(newest, "state.json")
    with open(path) as handle:
        text = handle.read()
    assert '"marker": 2' in text
    with open(path, "w") as handle:
        handle.write(text.replace('"marker": 2', '"marker": 3'))
    assert resume.saved_config(root)["marker"] == 1
    with pytest.raises(UsageError, match=re.escape(f"{newest} is damaged: state.json fails its xxh3_64 checksum")):
        resume.saved_config(newest)


@pytest.mark.parametrize("old_complete", ["", '{"step": 2}'])
def test_checkpoints_saved_before_checksums_resume_and_their_symbol_is_parsed(saved_root, tmp_path, old_complete):
    """Test that a checkpoint whose COMPLETE is as runs before checksums wrote it (empty, or only
    the step) is sound, and that its model-symbol.json cut short (MXNet's 'Expect' parse error,
    the reported crash) or with two bytes flipped is named by check_sound, so a resume of the
    models root falls back to the previous checkpoint."""
    root, previous, newest = copy_root(saved_root, tmp_path)
    for checkpoint in (previous, newest):
        with open(os.path.join(checkpoint, "COMPLETE"), "w") as handle:
            handle.write(old_complete)
    assert check_sound(newest, saved_root[1], SIDE, "fc")["step"] == 2
    symbol_file = os.path.join(newest, "model-symbol.json")
    intact = open(symbol_file, "rb").read()
    for damage in ("cut", "flip"):
        if damage == "cut":
            cut(symbol_file, len(intact) // 2)
        else:
            flip_byte(symbol_file, intact.index(b'"op"') + 1)        # "op" -> a name MXNet's parser rejects
            flip_byte(symbol_file, intact.index(b'"name"') + 1)
        with pytest.raises(UsageError, match=re.escape(f"checkpoint {newest} is damaged: model-symbol.json cannot be "
                                                       f"read (")):
            check_sound(newest, saved_root[1], SIDE, "fc")
        warnings = []
        assert resume.choose(root, saved_root[1], SIDE, "fc", warnings.append)[0] == previous
        assert len(warnings) == 1 and "model-symbol.json cannot be read" in warnings[0]
        with open(symbol_file, "wb") as handle:
            handle.write(intact)


def test_a_cut_symbol_json_is_named_by_its_size(saved_root, tmp_path):
    """Test that the reported repro, the newest checkpoint's model-symbol.json cut short, is
    found by its recorded size (before MXNet parses anything) and passed over with one warning."""
    root, previous, newest = copy_root(saved_root, tmp_path)
    symbol_file = os.path.join(newest, "model-symbol.json")
    size = os.path.getsize(symbol_file)
    cut(symbol_file, size // 2)
    warnings = []
    assert resume.choose(root, saved_root[1], SIDE, "fc", warnings.append)[0] == previous
    assert len(warnings) == 1 and f"model-symbol.json is truncated ({size // 2} bytes, {size} when written)" in warnings[0]


def test_the_tools_refuse_a_backbone_file_that_fails_its_checksum(saved_root, tmp_path):
    """Test that a tool loading a checkpoint (model_io.load_model_from_args) whose .params has a
    flipped byte in its last value (MXNet still loads it) refuses it naming the file, while the
    tools do not read, so do not check, the bank (a damaged bank row still loads the model)."""
    root, _, newest = copy_root(saved_root, tmp_path)
    args = SimpleNamespace(model=newest, image_size=SIDE, output=None, normalize="graph", network=None,
                           context=mx.cpu())
    bank = os.path.join(newest, "bank-rank0.weight.npy")
    flip_byte(bank, os.path.getsize(bank) - 1)
    assert model_io.load_model_from_args(args).epoch == 2
    params = os.path.join(newest, "model-0002.params")
    flip_byte(params, os.path.getsize(params) - 1)
    with pytest.raises(UsageError, match=re.escape(f"checkpoint {newest} is damaged: model-0002.params fails its "
                                                   f"xxh3_64 checksum")):
        model_io.load_model_from_args(args)
    with pytest.raises(UsageError, match="model-0002.params fails"):       # the root's newest: the same
        model_io.load_model_from_args(SimpleNamespace(**dict(vars(args), model=root)))
    assert [step for step, _ in list_checkpoints(root)] == [1, 2]


def write_old_complete(*checkpoints):
    """COMPLETE as runs before checksums wrote it: only the step."""
    for checkpoint in checkpoints:
        step = int(os.path.basename(checkpoint).split("-")[1])
        with open(os.path.join(checkpoint, "COMPLETE"), "w") as handle:
            json.dump({"step": step}, handle)


def binary_bytes(path):
    with open(path, "wb") as handle:
        handle.write(bytes(range(128, 256)) * 4)


def cut_half(path):
    cut(path, os.path.getsize(path) // 2)


def huge_array_count(path):
    """The NDArray file's array count (bytes 16-23) set to 2^40: MXNet would allocate for it."""
    with open(path, "r+b") as handle:
        handle.seek(16)
        handle.write((1 << 40).to_bytes(8, "little"))


def another_json(path):
    """rank0.json replaced by another JSON file of the checkpoint (its state.json)."""
    shutil.copy(os.path.join(os.path.dirname(path), "state.json"), path)


def another_data_state(path):
    """rank0.json whose data position lacks the iterator's seed."""
    with open(path) as handle:
        state = json.load(handle)
    del state["data"]["seed"]
    with open(path, "w") as handle:
        json.dump(state, handle)


OLD_FORMAT_DAMAGE = [("model-symbol.json", binary_bytes, "cannot be read (not a symbol JSON file"),
                     ("model-symbol.json", cut_half, "cannot be read (not a symbol JSON file"),
                     ("aux-rank0.params", huge_array_count, "cannot be read (Invalid NDArray file format"),
                     ("aux-rank0.params", cut_half, "cannot be read (Invalid NDArray file format"),
                     ("optimizer.params", cut_half, "cannot be read (Invalid NDArray file format"),
                     ("model-0002.params", huge_array_count, "cannot be read (Invalid NDArray file format"),
                     ("rank0.json", another_json, "holds no sampler and data state"),
                     ("rank0.json", another_data_state, "holds a data state without the keys")]


@pytest.mark.parametrize("name,damage,what", OLD_FORMAT_DAMAGE,
                         ids=[f"{name}-{damage.__name__}" for name, damage, _ in OLD_FORMAT_DAMAGE])
def test_damage_in_a_checkpoint_saved_before_checksums_is_named_and_passed_over(saved_root, tmp_path, name, damage,
                                                                                 what):
    """Test that in checkpoints whose COMPLETE is {"step": N} (saved before checksums), a binary or
    cut symbol JSON, a damaged aux, optimizer or model .params (MXNet's loader would fail with an
    MXNetError, a bad_alloc or an undecodable message) and a rank0.json holding another JSON are
    named by check_sound in one UsageError, and resume.choose over the models root goes back to
    the previous checkpoint with one warning."""
    root, previous, newest = copy_root(saved_root, tmp_path)
    write_old_complete(previous, newest)
    damage(os.path.join(newest, name))
    with pytest.raises(UsageError) as raised:
        check_sound(newest, saved_root[1], SIDE, "fc")
    assert str(raised.value).startswith(f"checkpoint {newest} is damaged: {name} {what}"), str(raised.value)
    assert "\n" not in str(raised.value)
    warnings = []
    chosen, state = resume.choose(root, saved_root[1], SIDE, "fc", warnings.append)
    assert (chosen, state["step"]) == (previous, 1)
    assert len(warnings) == 1 and f"is damaged: {name} " in warnings[0]


def test_a_damaged_aux_file_is_a_usage_error_when_restored_unchecked(saved_root, tmp_path, horovod):
    """Test that restore_checkpoint itself (the second line, behind check_sound) turns MXNet's
    failure on a damaged aux-rank0.params into a UsageError naming the file."""
    from sample_fc.checkpoint import restore_checkpoint
    _, _, newest = copy_root(saved_root, tmp_path)
    cut_half(os.path.join(newest, "aux-rank0.params"))
    module, _, data_iter = build(seed=1, bank_momentum="int8")
    with pytest.raises(UsageError, match=re.escape(f"cannot read BatchNorm statistics "
                                                   f"{os.path.join(newest, 'aux-rank0.params')}: ")):
        restore_checkpoint(newest, module, data_iter, CLASSES, 6)


def test_a_damaged_checkpoint_of_the_step_being_saved_is_moved_aside(saved_root, tmp_path, horovod, caplog):
    """Test that saving a step whose directory exists but is no sound checkpoint (a flipped byte,
    then no COMPLETE) moves it to step-XXXXXXXX.damaged, then .damaged-2, with one log line each,
    keeping its files; that these are never listed as checkpoints; and that a sound one of that
    step (re-saved after a resume) is replaced without a copy."""
    root, _, newest = copy_root(saved_root, tmp_path)
    bank = os.path.join(newest, "bank-rank0.weight.npy")
    flip_byte(bank, os.path.getsize(bank) - 1)
    damaged_bank = open(bank, "rb").read()
    module, symbol, data_iter = build(seed=1, bank_momentum="int8")

    def save():
        caplog.clear()
        save_checkpoint(root, 2, module, symbol, data_iter, dict(train_state(), config=config(2)), keep=2)
        verify_files(newest)
        return [r.getMessage() for r in caplog.records if "moved it to" in r.getMessage()]

    with caplog.at_level("WARNING", logger="sample_fc"):
        lines = save()
        assert lines == [f"{newest} was no sound checkpoint (checkpoint {newest} is damaged: bank-rank0.weight.npy "
                         f"fails its xxh3_64 checksum (its bytes changed after it was written)): moved it to "
                         f"{newest}.damaged before saving this step"]
        assert open(os.path.join(newest + ".damaged", "bank-rank0.weight.npy"), "rb").read() == damaged_bank
        os.remove(os.path.join(newest, "COMPLETE"))
        assert save() == [f"{newest} was no sound checkpoint (it has no COMPLETE): moved it to {newest}.damaged-2 "
                          f"before saving this step"]
        assert save() == []
    assert sorted(os.listdir(root)) == ["step-00000001", "step-00000002", "step-00000002.damaged",
                                        "step-00000002.damaged-2"]
    assert [step for step, _ in list_checkpoints(root)] == [1, 2]


def test_a_damaged_bank_shard_of_format_1_is_named_in_an_old_checkpoint(saved_root, tmp_path):
    """Test that an old-format checkpoint whose bank shard is format 1's one MXNet file
    (bank-rank0.params) is sound, and that with its array count damaged (MXNet would allocate for
    2^40 arrays) check_sound names it and a resume falls back to the previous checkpoint."""
    root, previous, newest = copy_root(saved_root, tmp_path)
    write_old_complete(previous, newest)
    for name in os.listdir(newest):
        if name.startswith("bank-rank0."):
            os.remove(os.path.join(newest, name))
    rows = mx.nd.zeros((CLASSES, 6))
    mx.nd.save(os.path.join(newest, "bank-rank0.params"),
               {"weight": rows, "momentum": rows, "meta": mx.nd.array([1, CLASSES, 1, 0, 0, CLASSES, 6], dtype="int64")})
    assert check_sound(newest, saved_root[1], SIDE, "fc")["step"] == 2
    huge_array_count(os.path.join(newest, "bank-rank0.params"))
    with pytest.raises(UsageError, match=re.escape(f"checkpoint {newest} is damaged: bank-rank0.params cannot be read "
                                                   f"(Invalid NDArray file format: the file says it holds")):
        check_sound(newest, saved_root[1], SIDE, "fc")
    assert resume.choose(root, saved_root[1], SIDE, "fc", lambda line: None)[0] == previous
