"""Tests for sample_fc.checkpoint: finding complete checkpoints, save/restore in one process."""
import json
import os
import re

import mxnet as mx
import numpy as np
import pytest
import xxhash

from sample_fc import dist
from sample_fc.checkpoint import (check_sound, find_checkpoint, list_checkpoints, read_rank_state, read_state,
                                  restore_checkpoint, save_checkpoint)
from sample_fc.errors import UsageError
from sample_fc.data import SyntheticIter
from sample_fc.module import SampleDistributeModule
from sample_fc.optimizers import BackboneOptimizer, WarmupMultiStepSchedule
from sample_fc.pfc.partial_fc import PartialFC, PartialFCOptions

CLASSES, EMBEDDING, BATCH, DATA_SHAPE = 20, 6, 4, (3, 4, 4)


def make_root(root, complete=(), incomplete=(), partial=(), other=()):
    """A models root with step-XXXXXXXX dirs: complete (COMPLETE file), incomplete (none),
    partial (`.partial` suffix, COMPLETE inside), and other names holding a COMPLETE file."""
    os.makedirs(root, exist_ok=True)
    for step in complete:
        os.makedirs(os.path.join(root, f"step-{step:08d}"))
        open(os.path.join(root, f"step-{step:08d}", "COMPLETE"), "w").close()
    for step in incomplete:
        os.makedirs(os.path.join(root, f"step-{step:08d}"))
    for step in partial:
        os.makedirs(os.path.join(root, f"step-{step:08d}.partial"))
        open(os.path.join(root, f"step-{step:08d}.partial", "COMPLETE"), "w").close()
    for name in other:
        os.makedirs(os.path.join(root, name))
        open(os.path.join(root, name, "COMPLETE"), "w").close()
    return str(root)


def test_list_checkpoints_keeps_only_complete_well_named_dirs_sorted_by_step(tmp_path):
    """Test that list_checkpoints ignores .partial dirs, dirs without COMPLETE, other names and
    plain files, and returns (step, path) sorted by step number."""
    root = make_root(tmp_path / "models", complete=(300, 20, 1000, 7), incomplete=(2000,), partial=(5000,),
                     other=("step-5", "step-000000099", "best", "step-00000012x"))
    (tmp_path / "models" / "step-00000008").write_text("a file, not a checkpoint")
    assert list_checkpoints(root) == [(s, os.path.join(root, f"step-{s:08d}")) for s in (7, 20, 300, 1000)]
    assert list_checkpoints(str(tmp_path / "missing")) == []


def test_find_checkpoint_direct_newest_and_by_step(tmp_path):
    """Test that find_checkpoint returns a checkpoint dir given directly, the newest complete one
    under a models root (never a newer .partial or incomplete one), and the one of `step`."""
    root = make_root(tmp_path / "models", complete=(4, 12, 8), incomplete=(16,), partial=(20,))
    direct = os.path.join(root, "step-00000008")
    assert find_checkpoint(direct) == direct
    assert find_checkpoint(root) == os.path.join(root, "step-00000012")
    assert find_checkpoint(root, step=4) == os.path.join(root, "step-00000004")


def test_find_checkpoint_errors_name_the_option_path_and_complete_steps(tmp_path):
    """Test that a root without complete checkpoints, or a missing step, raises FileNotFoundError
    naming the option and the path, and for a step the complete steps there."""
    empty = make_root(tmp_path / "empty", incomplete=(3,), partial=(4,))
    with pytest.raises(FileNotFoundError, match=re.escape(f"--resume {empty}: no complete checkpoint")):
        find_checkpoint(empty)
    with pytest.raises(FileNotFoundError, match=re.escape(f"--weights {tmp_path / 'nowhere'}")):
        find_checkpoint(str(tmp_path / "nowhere"), option="--weights")
    root = make_root(tmp_path / "models", complete=(30, 10, 200), incomplete=(40,), partial=(50,))
    for step in (40, 50, 7):
        with pytest.raises(FileNotFoundError) as raised:
            find_checkpoint(root, step=step, option="--eval")
        message = str(raised.value)
        assert message.startswith(f"--eval {root},{step}: no complete checkpoint step-{step:08d}/")
        assert "complete: 10, 30, 200" in message


# ---- save and restore in one process ----------------------------------------------------

@pytest.fixture(scope="module")
def horovod():
    """Horovod in this process (world size 1, no horovodrun)."""
    dist.init()
    assert dist.size() == 1 and dist.rank() == 0


def build(seed, num_classes=CLASSES, bank_momentum="same"):
    """(module, symbol, data iterator) of a tiny run: an FC + BatchNorm backbone, 50% sampling,
    an lr that halves at update 3, the bank's momentum stored as `bank_momentum`. `seed` sets the
    initial backbone, bank and sampler."""
    flat = mx.sym.Flatten(mx.sym.var("data"))
    symbol = mx.sym.BatchNorm(mx.sym.FullyConnected(flat, num_hidden=EMBEDDING, name="fc_embed"),
                              fix_gamma=False, name="bn_embed")
    schedule = WarmupMultiStepSchedule(0.05, warmup_steps=0, steps=[3], factor=0.5)
    backbone_opt = BackboneOptimizer(mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, wd=5e-4,
                                                         rescale_grad=1.0, lr_scheduler=schedule))
    options = PartialFCOptions(sample_ratio=0.5, loss_s=8.0, seed=seed, bank_momentum=bank_momentum)
    partial_fc = PartialFC.for_rank(num_classes, 0, 1, EMBEDDING, mx.cpu(), options, schedule)
    module = SampleDistributeModule(symbol, partial_fc, backbone_opt, context=mx.cpu(), batch_size=BATCH,
                                    data_shape=DATA_SHAPE)
    rng = np.random.default_rng(seed)
    features = int(np.prod(DATA_SHAPE))
    module.init_params(arg_params={"fc_embed_weight": mx.nd.array(rng.standard_normal((EMBEDDING, features)) * 0.01),
                                   "fc_embed_bias": mx.nd.array(rng.standard_normal(EMBEDDING)),
                                   "bn_embed_gamma": mx.nd.array(1 + rng.random(EMBEDDING)),
                                   "bn_embed_beta": mx.nd.array(rng.standard_normal(EMBEDDING))},
                       aux_params={"bn_embed_moving_mean": mx.nd.array(rng.standard_normal(EMBEDDING)),
                                   "bn_embed_moving_var": mx.nd.array(1 + rng.random(EMBEDDING))})
    module.broadcast_parameters()
    return module, symbol, SyntheticIter(BATCH, num_classes, DATA_SHAPE, seed=3)


def train_state(num_classes=CLASSES):
    return {"world_size": 1, "num_classes": num_classes, "embedding_size": EMBEDDING, "config": {}}


def snapshot(module):
    """Copies of everything a step changes: backbone params (arg and aux), bank weight and momentum."""
    arg_params, aux_params = module.backbone.get_params()
    state = {f"arg:{k}": v.asnumpy() for k, v in arg_params.items()}
    state.update({f"aux:{k}": v.asnumpy() for k, v in aux_params.items()})
    state["bank_weight"], state["bank_momentum"] = module.partial_fc.bank.weight.asnumpy(), module.partial_fc.bank.momentum.asnumpy()
    return state


@pytest.fixture(scope="module")
def saved(horovod, tmp_path_factory):
    """A module trained 2 steps and its checkpoint: (models_root, checkpoint, module, data_iter, params at save)."""
    models_root = str(tmp_path_factory.mktemp("models"))
    module, symbol, data_iter = build(seed=1)
    losses = [module.step(data_iter.next()) for _ in range(2)]
    assert all(np.isfinite(loss) and not skipped for loss, skipped in losses)
    at_save = snapshot(module)
    checkpoint = save_checkpoint(models_root, 2, module, symbol, data_iter, train_state(), keep=2)
    return models_root, checkpoint, module, data_iter, at_save


def test_save_writes_the_documented_layout(saved):
    """Test that a saved checkpoint holds exactly the documented files with the right contents
    (state, rank state, a model loadable by mx.model.load_checkpoint, COMPLETE with the step and
    every other file's size and xxh3_64 of its bytes on disk) and that no .partial directory or
    temporary file is left behind."""
    models_root, checkpoint, module, _, at_save = saved
    assert checkpoint == os.path.join(models_root, "step-00000002")
    assert os.listdir(models_root) == ["step-00000002"]
    assert sorted(os.listdir(checkpoint)) == sorted([
        "model-symbol.json", "model-0002.params", "optimizer.params", "bank-rank0.json", "bank-rank0.weight.npy", "bank-rank0.momentum.npy", "aux-rank0.params",
        "rank0.json", "state.json", "COMPLETE"])
    assert read_state(checkpoint) == dict(train_state(), step=2)
    with open(os.path.join(checkpoint, "COMPLETE")) as handle:
        complete = json.load(handle)
    on_disk = {}
    for name in sorted(set(os.listdir(checkpoint)) - {"COMPLETE"}):
        with open(os.path.join(checkpoint, name), "rb") as handle:
            data = handle.read()
        on_disk[name] = {"bytes": len(data), "xxh3_64": xxhash.xxh3_64(data).hexdigest()}
    assert complete == {"step": 2, "files": on_disk}
    rank_state = read_rank_state(checkpoint, 0)
    assert rank_state["data"] == {"epoch": 0, "image_in_epoch": 2 * BATCH, "seed": 3}   # 2 steps of 1 x BATCH
    assert set(rank_state["sampler"]) == {"bit_generator"}
    _, arg_params, aux_params = mx.model.load_checkpoint(os.path.join(checkpoint, "model"), 2)
    assert set(arg_params) == {"fc_embed_weight", "fc_embed_bias", "bn_embed_gamma", "bn_embed_beta"}
    assert set(aux_params) == {"bn_embed_moving_mean", "bn_embed_moving_var"}
    for name, value in arg_params.items():
        np.testing.assert_array_equal(value.asnumpy(), at_save[f"arg:{name}"])
    for name, value in aux_params.items():
        np.testing.assert_array_equal(value.asnumpy(), at_save[f"aux:{name}"])
    assert list_checkpoints(models_root) == [(2, checkpoint)]


def test_restore_then_step_matches_the_uninterrupted_run(saved, monkeypatch):
    """Test that a fresh module (other initial backbone, bank and sampler seed) restored from the
    checkpoint takes step 3 exactly as the original: same loss, backbone params (BatchNorm
    statistics included) and bank, which needs the backbone momentum, update count (the lr
    halves at 3), sampler RNG and data position all restored; and that restoring unpickles
    nothing (a checkpoint's files are data only)."""
    import pickle

    def no_unpickling(*args, **kwargs):
        raise AssertionError("restore_checkpoint unpickled something")

    _, checkpoint, original, original_iter, at_save = saved
    restored, _, restored_iter = build(seed=2)
    assert not np.array_equal(snapshot(restored)["bank_weight"], at_save["bank_weight"])
    monkeypatch.setattr(pickle, "loads", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    assert restore_checkpoint(checkpoint, restored, restored_iter, CLASSES, EMBEDDING) == 2
    monkeypatch.undo()
    assert restored.num_update == 2 and restored_iter.state_dict() == original_iter.state_dict()
    after_restore = snapshot(restored)
    for key, value in at_save.items():
        np.testing.assert_array_equal(after_restore[key], value, err_msg=key)

    loss, skipped = original.step(original_iter.next())
    loss_restored, skipped_restored = restored.step(restored_iter.next())
    assert not skipped and not skipped_restored
    np.testing.assert_allclose(loss_restored, loss, rtol=1e-6)
    expected, actual = snapshot(original), snapshot(restored)
    for key, value in expected.items():
        np.testing.assert_allclose(actual[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    for key in ("arg:fc_embed_weight", "aux:bn_embed_moving_mean", "bank_weight", "bank_momentum"):
        assert not np.array_equal(expected[key], at_save[key]), f"step 3 did not change {key}"


def test_restore_rejects_other_class_count_or_embedding_size(saved):
    """Test that restoring into a run with another num_classes or embedding_size raises
    ValueError naming the key, the checkpoint's value and this run's value."""
    _, checkpoint, _, _, _ = saved
    with pytest.raises(ValueError, match=f"num_classes={CLASSES}, this run has num_classes={CLASSES + 1}"):
        restore_checkpoint(checkpoint, None, None, CLASSES + 1, EMBEDDING)
    with pytest.raises(ValueError, match=f"embedding_size={EMBEDDING}, this run has embedding_size=8"):
        restore_checkpoint(checkpoint, None, None, CLASSES, 8)


def test_keep_deletes_all_but_the_newest_checkpoints(horovod, tmp_path):
    """Test that saving with keep=2 after each of 4 steps leaves only the newest 2 checkpoints,
    and that a stale .partial of a killed save is replaced, not merged into the new one."""
    models_root = str(tmp_path)
    stale = tmp_path / "step-00000004.partial"
    stale.mkdir()
    (stale / "junk.params").write_text("left by a killed save")
    module, symbol, data_iter = build(seed=1)
    for step in range(1, 5):
        module.step(data_iter.next())
        save_checkpoint(models_root, step, module, symbol, data_iter, train_state(), keep=2)
        assert [s for s, _ in list_checkpoints(models_root)] == list(range(max(1, step - 1), step + 1))
    assert sorted(os.listdir(models_root)) == ["step-00000003", "step-00000004"]
    assert "junk.params" not in os.listdir(tmp_path / "step-00000004")


@pytest.mark.parametrize("storage", ["int8", "none"])
def test_a_bank_without_float_momentum_saves_restores_and_is_checked(horovod, tmp_path, storage):
    """Test that a run whose bank stores int8 momentum (or none) saves the shard files of that
    storage (codes and their scales; no momentum file), that a fresh module restored from it holds
    the weights, codes and scales bit for bit and steps on exactly as the original, that a module storing
    its momentum otherwise is refused naming both storages, and that check_sound names a
    truncated or missing file of that storage."""
    module, symbol, data_iter = build(seed=1, bank_momentum=storage)
    for _ in range(2):
        assert not module.step(data_iter.next())[1]
    config = {"num_classes": CLASSES, "embedding_size": EMBEDDING, "bank_dtype": "float32", "bank_momentum": storage,
              "network": "fc"}
    state = dict(train_state(), config=config)
    checkpoint = save_checkpoint(str(tmp_path), 2, module, symbol, data_iter, state, keep=2)
    bank_files = sorted(name for name in os.listdir(checkpoint) if name.startswith("bank-"))
    files = ["bank-rank0.json", "bank-rank0.weight.npy"]
    if storage == "int8":
        files += ["bank-rank0.momentum.npy", "bank-rank0.momentum_scale.npy"]
    assert bank_files == sorted(files)
    check_sound(checkpoint, symbol, DATA_SHAPE[1], "fc")

    def stored(a_module):
        return {name: np.concatenate([b.asnumpy() for b in blocks])
                for name, blocks in a_module.partial_fc.bank.row_arrays().items()}
    restored, _, restored_iter = build(seed=1, bank_momentum=storage)    # the run's seed: its rounding noise
    assert not np.array_equal(stored(restored)["weight"], stored(module)["weight"])
    assert restore_checkpoint(checkpoint, restored, restored_iter, CLASSES, EMBEDDING) == 2
    for name, values in stored(module).items():
        np.testing.assert_array_equal(stored(restored)[name], values, err_msg=name)
    loss, loss_restored = module.step(data_iter.next())[0], restored.step(restored_iter.next())[0]
    np.testing.assert_allclose(loss_restored, loss, rtol=1e-6)
    for name, values in stored(module).items():          # the same update: the same codes and scales
        np.testing.assert_array_equal(stored(restored)[name], values, err_msg=f"{name} after a step")
    other, _, other_iter = build(seed=2)
    with pytest.raises(UsageError, match=f"has momentum_storage={storage}, this bank expects momentum_storage=same"):
        restore_checkpoint(checkpoint, other, other_iter, CLASSES, EMBEDDING)
    damaged = "bank-rank0.momentum_scale.npy" if storage == "int8" else "bank-rank0.weight.npy"
    path = os.path.join(checkpoint, damaged)
    with open(path, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data[:-4])
    with pytest.raises(UsageError, match=f"is damaged: {re.escape(damaged)} is truncated"):
        check_sound(checkpoint, symbol, DATA_SHAPE[1], "fc")
    os.remove(path)
    with pytest.raises(UsageError, match=f"is damaged: {re.escape(damaged)} is missing$"):
        check_sound(checkpoint, symbol, DATA_SHAPE[1], "fc")


def test_a_data_position_saved_in_batches_becomes_images_of_the_old_global_batch():
    """Test that a rank<r>.json data state of before image positions (batches of the old world)
    resumes at batch x old world size x batch_size images, and a current one as it is."""
    from sample_fc.checkpoint.legacy import data_state
    old = {"epoch": 3, "batch_in_epoch": 5, "seed": 1}
    assert data_state(old, old_world=2, batch_size=64) == {"epoch": 3, "image_in_epoch": 640, "seed": 1}
    new = {"epoch": 3, "image_in_epoch": 100, "seed": 1}
    assert data_state(new, old_world=2, batch_size=64) == new
