"""The arcface_torch yardstick (bench/yardstick/): its loss, sampling, SGD, network
sizes and .rec data path, each checked against a reference computed here (NumPy, hand
formulas, arcface_torch's own parameter counts). torch cannot be imported after horovod.mxnet,
which this test process has imported: the torch side runs once in a process of its own (this
file run as a script) and saves what it computed; the tests compare. No network, no
arcface_torch checkout needed."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

# arcface_torch's own numbers (get_model(name, dropout=0, fp16=False, num_features=512) at 112 px):
# sum of parameter sizes, and state dict entries
ARCFACE_TORCH_SIZES = {"mbf": (2059520, 333), "r18": (24025600, 187), "r50": (43590848, 475),
                       "vit_t": (19137792, 150)}    # vit.py: 144 parameters and its 2 BatchNorm1d's 3 buffers each
SAMPLING_CASES = ((100, 0.3), (100, 0.29), (1000, 0.1), (20, 0.1))    # (classes, sample_rate)


# ---- the torch side, run as `python tests/test_yardstick.py OUT_DIR` ----------------------

def _write_rec(folder, images, labels):
    """A .rec as insightface packs one: header record 0 (flag 2), PNG images 1..N, identity records."""
    import io

    import mxnet as mx
    from PIL import Image
    record = mx.recordio.MXIndexedRecordIO(str(folder / "train.idx"), str(folder / "train.rec"), "w")
    count = len(images)
    record.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(2, [count + 1, count + 2], 0, 0), b""))
    for key, (pixels, label) in enumerate(zip(images, labels), start=1):
        png = io.BytesIO()
        Image.fromarray(pixels).save(png, format="PNG")
        record.write_idx(key, mx.recordio.pack(mx.recordio.IRHeader(0, float(label), key, 0), png.getvalue()))
    record.write_idx(count + 1, mx.recordio.pack(mx.recordio.IRHeader(2, [1, count + 1], 0, 0), b""))
    record.close()


def _losses(out):
    import torch
    from bench.yardstick import CombinedMargin, PartialFC
    torch.manual_seed(0)
    embeddings, labels = torch.randn(8, 16), torch.tensor([0, 3, 3, 9, 1, 7, 2, 3])
    result = {"embeddings": embeddings.numpy(), "labels": labels.numpy()}
    for name, margins in (("cosface", (1.0, 0.0, 0.25)), ("arcface", (1.0, 0.5, 0.0))):
        head = PartialFC(CombinedMargin(64.0, *margins), 16, 10, sample_rate=1.0)
        inputs = embeddings.clone().requires_grad_(True)
        loss = head(inputs, labels)
        loss.backward()
        result.update({f"{name}/centers": head.weight.detach().numpy(), f"{name}/loss": loss.detach().numpy(),
                       f"{name}/center_grad": head.weight.grad.numpy()})
    np.savez(out / "losses.npz", **result)


def _sampling(out):
    import torch
    from bench.yardstick import CombinedMargin, PartialFC, sample_centers
    torch.manual_seed(1)
    cases = []
    for classes, rate in SAMPLING_CASES:
        labels = torch.randint(0, classes, (64,))
        head = PartialFC(CombinedMargin(), 8, classes, rate)
        kept, positions = sample_centers(labels, classes, head.num_sample)
        cases.append({"classes": classes, "rate": rate, "num_sample": head.num_sample,
                      "labels": labels.tolist(), "kept": kept.tolist(), "positions": positions.tolist()})
    (out / "sampling.json").write_text(json.dumps(cases))


def _one_sgd_step(out):
    """A tiny backbone (Linear with bias, BatchNorm1d with its scale frozen) through one Trainer step."""
    import copy

    import torch
    from torch import nn
    from bench.yardstick import CombinedMargin, PartialFC, Trainer, scheduled_lr
    torch.manual_seed(2)
    backbone = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    backbone[1].weight.requires_grad_(False)
    with torch.no_grad():
        backbone[1].bias.uniform_(-1, 1)
    head = PartialFC(CombinedMargin(64.0, 1.0, 0.0, 0.25), 4, 5)
    images, labels = torch.randn(10, 6) * 30, torch.randint(0, 5, (10,))
    before = {n: p.detach().clone() for n, p in [*backbone.named_parameters(), ("centers", head.weight)]}
    # the gradients the step will use, from copies
    twin_backbone, twin_head = copy.deepcopy(backbone), copy.deepcopy(head)
    twin_head(twin_backbone(images), labels).backward()
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in [*twin_backbone.named_parameters(), ("centers", twin_head.weight)]}
    trainer = Trainer(backbone, head, lr=0.1, weight_decay=0.05, warmup_steps=2, total_steps=10)
    trainer.step(images, labels)
    after = {n: p.detach() for n, p in [*backbone.named_parameters(), ("centers", head.weight)]}
    arrays = {f"before/{n}": v.numpy() for n, v in before.items()}
    arrays.update({f"grad/{n}": v.numpy() for n, v in grads.items()})
    arrays.update({f"after/{n}": v.numpy() for n, v in after.items()})
    arrays["lr_after_step"] = np.array(trainer.optimizer.param_groups[0]["lr"])
    arrays["schedule"] = np.array([scheduled_lr(0.1, s, 2, 10) for s in range(12)])
    np.savez(out / "sgd.npz", **arrays)


def _networks(out):
    import torch
    from bench.yardstick import build_network, parameter_count
    sizes = {}
    for name, image_size in (("mbf", 112), ("mbf", 32), ("r18", 112), ("r50", 112), ("vit_t", 112)):
        net = build_network(name, image_size).eval()
        with torch.no_grad():
            shape = list(net(torch.zeros(2, 3, image_size, image_size)).shape)
            training = list(net.train()(torch.rand(2, 3, image_size, image_size)).shape)   # masking, drop path
        sizes[f"{name}/{image_size}"] = {"params": parameter_count(net), "entries": len(net.state_dict()),
                                         "output": shape, "training_output": training,
                                         "first_entries": list(net.state_dict())[:8]}
    (out / "networks.json").write_text(json.dumps(sizes))


def _data(out):
    import torch
    from bench.yardstick import MemoryFaces, RecFaces, rec_loader
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (6, 12, 12, 3), dtype=np.uint8)
    labels = np.array([4, 0, 5, 1, 3, 2])
    _write_rec(out, images, labels)
    plain = RecFaces(str(out), flip=False)
    memory = MemoryFaces.from_rec(str(out))
    loader_batch = next(iter(rec_loader(plain, batch_size=6, workers=2)))
    flips = RecFaces(str(out), flip=True)
    torch.manual_seed(4)
    flipped = np.stack([flips[0][0].numpy() for _ in range(16)])
    np.savez(out / "data.npz", raw=images, raw_labels=labels, count=len(plain),
             item=np.stack([plain[i][0].numpy() for i in range(len(plain))]),
             item_labels=np.array([int(plain[i][1]) for i in range(len(plain))]),
             memory=memory.images.numpy(), memory_labels=memory.labels.numpy(),
             loader=loader_batch[0].numpy(), loader_labels=loader_batch[1].numpy(), flipped=flipped)


def _tiny_trainer_parts(seed):
    """A tiny backbone (Linear, BatchNorm1d with its scale frozen) and a CosFace PartialFC."""
    import torch
    from torch import nn
    from bench.yardstick import CombinedMargin, PartialFC
    torch.manual_seed(seed)
    backbone = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    backbone[1].weight.requires_grad_(False)
    return backbone, PartialFC(CombinedMargin(64.0, 1.0, 0.0, 0.25), 4, 5)


def _staged_and_scheduled(out):
    """The same two steps plain and timed by stage (given lrs per update); one step unclipped."""
    import copy

    import torch
    from bench.yardstick import Trainer
    from bench.yardstick.stages import StageClock, timed_step
    backbone, head = _tiny_trainer_parts(5)
    twin_backbone, twin_head = copy.deepcopy(backbone), copy.deepcopy(head)
    batches = [(torch.randn(10, 6) * 30, torch.randint(0, 5, (10,))) for _ in range(2)]
    lrs = [0.3, 0.2, 0.1]
    plain = Trainer(backbone, head, 0.1, 0.05, lr_at=lambda n: lrs[n - 1])
    staged = Trainer(twin_backbone, twin_head, 0.1, 0.05, lr_at=lambda n: lrs[n - 1])
    lr_before = plain.optimizer.param_groups[0]["lr"]
    for images, labels in batches:
        plain.step(images, labels)
    marks = []
    clock = StageClock()
    staged.step(*batches[0], mark=lambda stage: (marks.append(stage), clock(stage)))
    seconds = timed_step(staged, iter(batches[1:]))
    pairs = zip([*backbone.parameters(), head.weight], [*twin_backbone.parameters(), twin_head.weight])
    # one unclipped step (clip_norm 0) and the gradients it used, from a copy
    backbone, head = _tiny_trainer_parts(6)
    images, labels = torch.randn(10, 6) * 30, torch.randint(0, 5, (10,))
    twin_backbone, twin_head = copy.deepcopy(backbone), copy.deepcopy(head)
    twin_head(twin_backbone(images), labels).backward()
    before = [p.detach().clone() for p in backbone.parameters() if p.requires_grad]
    grads = [p.grad.clone() for p in twin_backbone.parameters() if p.requires_grad]
    Trainer(backbone, head, 0.1, 0.0, clip_norm=0).step(images, labels)
    after = [p.detach() for p in backbone.parameters() if p.requires_grad]
    np.savez(out / "staged.npz", max_diff=max(float((a - b).abs().max()) for a, b in pairs),
             marks=np.array(marks), clock_stages=np.array(list(clock.seconds)),
             timed_stages=np.array(list(seconds)), timed_seconds=np.array(list(seconds.values())),
             lr_before=lr_before, lr_after=plain.optimizer.param_groups[0]["lr"],
             grad_norm=float(torch.sqrt(sum((g ** 2).sum() for g in grads))),
             unclipped_error=max(float((a - (b - 0.1 * g)).abs().max()) for a, b, g in zip(after, before, grads)))


def _tuned(out):
    """One step of arcface_torch's mbf at 32 px from one state on the same batch: as it runs
    (NCHW) and tuned (channels-last model and batches)."""
    import copy

    import torch
    from bench.yardstick import CombinedMargin, PartialFC, Trainer, build_network
    from bench.yardstick.tuned import channels_last, channels_last_batches
    torch.manual_seed(3)
    backbone, head = build_network("mbf", 32, 16), PartialFC(CombinedMargin(32.0, 1.0, 0.0, 0.25), 16, 10)
    twin_backbone, twin_head = copy.deepcopy(backbone), copy.deepcopy(head)
    before = [p.detach().clone() for p in backbone.parameters()]
    batches = [(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))]
    plain = Trainer(backbone, head, 0.1, 5e-4)
    tuned = Trainer(channels_last(twin_backbone), twin_head, 0.1, 5e-4)
    tuned_batches = list(channels_last_batches(batches))
    losses = [[float(trainer.step(*batch)) for batch in these]
              for trainer, these in ((plain, batches), (tuned, tuned_batches))]
    weight = next(p for p in twin_backbone.parameters() if p.dim() == 4)
    np.savez(out / "tuned.npz", losses=np.array(losses),
             largest_change=max(float((p.detach() - b).abs().max()) for p, b in zip(backbone.parameters(), before)),
             max_diff=max(float((a - b).abs().max()) for a, b in zip(backbone.parameters(), twin_backbone.parameters())),
             weight_channels_last=weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous(),
             batch_channels_last=all(images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
                                     for images, _ in tuned_batches))


def _scoring(out):
    """embed_pairs of a flatten + Linear backbone on uint8 images, in batches of 3."""
    import torch
    from torch import nn
    from bench.yardstick.scoring import embed_pairs
    torch.manual_seed(7)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5)).train()
    images = np.random.default_rng(8).integers(0, 256, (7, 4, 4, 3), dtype=np.uint8)
    embeddings = embed_pairs(backbone, images, batch_size=3)
    np.savez(out / "scoring.npz", images=images, embeddings=embeddings, training_after=backbone.training,
             weight=backbone[1].weight.detach().numpy(), bias=backbone[1].bias.detach().numpy())


def _sharded_rank(rank, world, store, out, margins):
    """One of `world` Gloo processes: ShardedPartialFC's loss and gradients on its rows and classes."""
    import torch
    from torch import distributed
    from bench.yardstick import CombinedMargin
    from bench.yardstick.ddp import ShardedPartialFC
    distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    arrays = np.load(out / "losses.npz")
    embeddings, labels = torch.tensor(arrays["embeddings"]), torch.tensor(arrays["labels"])
    rows = len(labels) // world
    head = ShardedPartialFC(CombinedMargin(64.0, *margins), 16, 10)
    with torch.no_grad():
        head.weight.copy_(torch.tensor(arrays["cosface/centers"])[head.class_start:head.class_start + head.num_local])
    local = embeddings[rank * rows:(rank + 1) * rows].clone().requires_grad_(True)
    loss = head(local, labels[rank * rows:(rank + 1) * rows])
    loss.backward()
    np.savez(out / f"sharded_{margins[2]}_{rank}.npz", loss=loss.item(), embeddings_grad=local.grad.numpy(),
             centers_grad=head.weight.grad.numpy(), class_start=head.class_start)
    distributed.destroy_process_group()


def _sharded(out):
    import torch.multiprocessing
    for margins in ((1.0, 0.0, 0.25), (1.0, 0.5, 0.0)):
        torch.multiprocessing.spawn(_sharded_rank, nprocs=2, join=True,
                                    args=(2, str(out / f"store{margins[2]}"), out, margins))


def compute(out):
    for part in (_losses, _sampling, _one_sgd_step, _networks, _data, _staged_and_scheduled, _tuned, _scoring, _sharded):
        part(out)


# ---- the tests ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    out = tmp_path_factory.mktemp("yardstick")
    result = subprocess.run([sys.executable, __file__, str(out)], capture_output=True, text=True,
                            timeout=300, cwd=str(REPO))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def numpy_margin_loss(embeddings, centers, labels, scale, m2, m3):
    """Mean cross-entropy of s * margined cos(embedding, center), all in NumPy float64."""
    e = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    w = centers / np.linalg.norm(centers, axis=1, keepdims=True)
    cosine = np.clip(e.astype(np.float64) @ w.T.astype(np.float64), -1, 1)
    rows = np.arange(len(labels))
    cosine[rows, labels] = np.cos(np.arccos(cosine[rows, labels]) + m2) - m3
    logits = scale * cosine
    logits -= logits.max(axis=1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -log_p[rows, labels].mean(), np.exp(log_p), e, w


@pytest.mark.parametrize("name,m2,m3", [("cosface", 0.0, 0.25), ("arcface", 0.5, 0.0)])
def test_partial_fc_at_rate_one_is_numpy_cross_entropy_of_margined_cosines(computed, name, m2, m3):
    """Test that PartialFC at sample rate 1 gives the mean cross-entropy of 64 x the margined
    cosines (CosFace m3 = 0.25, ArcFace m2 = 0.5) computed in NumPy, and that the margin passes
    no gradient of its own: the centers' gradient is that of the loss over s * cosine with the
    margined softmax's (p - onehot) / B, as arcface_torch's CombinedMarginLoss and softmax give."""
    arrays = np.load(computed / "losses.npz")
    embeddings, labels, centers = arrays["embeddings"], arrays["labels"], arrays[f"{name}/centers"]
    want, p, e, w = numpy_margin_loss(embeddings, centers, labels, 64.0, m2, m3)
    np.testing.assert_allclose(arrays[f"{name}/loss"], want, rtol=1e-5)
    # d loss / d cosine = 64 (p - onehot) / B; then through normalize(centers)
    d_cosine = p.copy()
    d_cosine[np.arange(len(labels)), labels] -= 1
    d_cosine *= 64.0 / len(labels)
    d_w = d_cosine.T @ e
    norms = np.linalg.norm(centers, axis=1, keepdims=True)
    d_centers = (d_w - w * (d_w * w).sum(axis=1, keepdims=True)) / norms
    np.testing.assert_allclose(arrays[f"{name}/center_grad"], d_centers, rtol=1e-3, atol=1e-4 * np.abs(d_centers).max())


@pytest.mark.parametrize("name,m2,m3", [("cosface", 0.0, 0.25), ("arcface", 0.5, 0.0)])
def test_ddp_head_on_two_processes_is_the_one_process_loss(computed, name, m2, m3):
    """Test that the DDP yardstick's PartialFC_V2 on 2 Gloo processes (5 classes each, 4 rows
    each) gives the one-process NumPy loss on every rank, each rank the centers' gradient of its
    classes, and each rank 2x the gradient of its rows (AllGather's backward undoes DDP's
    average over the 2)."""
    arrays = np.load(computed / "losses.npz")
    embeddings, labels, centers = arrays["embeddings"], arrays["labels"], arrays["cosface/centers"]
    want, p, e, w = numpy_margin_loss(embeddings, centers, labels, 64.0, m2, m3)
    ranks = [np.load(computed / f"sharded_{m3}_{rank}.npz") for rank in range(2)]
    assert [int(r["class_start"]) for r in ranks] == [0, 5]
    for rank in ranks:
        np.testing.assert_allclose(rank["loss"], want, rtol=1e-5)
    d_cosine = p.copy()
    d_cosine[np.arange(len(labels)), labels] -= 1
    d_cosine *= 64.0 / len(labels)
    d_w_hat, d_e_hat = d_cosine.T @ e, d_cosine @ w
    norms_w = np.linalg.norm(centers, axis=1, keepdims=True)
    norms_e = np.linalg.norm(embeddings, axis=1, keepdims=True)
    d_centers = (d_w_hat - w * (d_w_hat * w).sum(1, keepdims=True)) / norms_w
    d_embeddings = (d_e_hat - e * (d_e_hat * e).sum(1, keepdims=True)) / norms_e
    np.testing.assert_allclose(np.concatenate([r["centers_grad"] for r in ranks]), d_centers, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([r["embeddings_grad"] for r in ranks]), 2 * d_embeddings,
                               rtol=1e-4, atol=1e-6)


def test_sampling_keeps_every_positive_and_int_of_rate_times_classes(computed):
    """Test that PartialFC_V2's sampling keeps int(sample_rate * classes) sorted distinct centers
    (int truncates: 0.29 x 100 -> 28) containing every class of the batch, or exactly the
    batch's classes when they are more, and that each label becomes its class's position."""
    for case in json.loads((computed / "sampling.json").read_text()):
        num_sample = int(case["rate"] * case["classes"])
        assert case["num_sample"] == num_sample
        positives, kept = sorted(set(case["labels"])), case["kept"]
        if len(positives) > num_sample:
            assert kept == positives
        else:
            assert len(kept) == num_sample and kept == sorted(set(kept))
            assert set(positives) <= set(kept)
        assert [kept[p] for p in case["positions"]] == case["labels"]
    assert any(len(set(c["labels"])) > c["num_sample"] for c in json.loads((computed / "sampling.json").read_text()))


def test_sgd_step_decays_every_trained_parameter_after_clipping(computed):
    """Test that one step is SGD as train_v2.py sets it: p - lr (g + wd p) on every parameter
    with a gradient (the Linear's bias, the BN's shift and the centers included; the frozen BN
    scale untouched), the backbone's gradient clipped to norm 5 and the centers' not, and
    that the lr schedule then moves to its warm-up value (lr x 1/2 after step 1 of 2)."""
    arrays = np.load(computed / "sgd.npz")
    lr, wd = 0.1, 0.05
    backbone = ["0.weight", "0.bias", "1.bias"]
    norm = np.sqrt(sum((arrays[f"grad/{n}"] ** 2).sum() for n in backbone))
    assert norm > 5                                         # the clip acts in this case
    for name in backbone + ["centers"]:
        grad = arrays[f"grad/{name}"] * (5 / (norm + 1e-6) if name in backbone else 1.0)
        want = arrays[f"before/{name}"] - lr * (grad + wd * arrays[f"before/{name}"])
        np.testing.assert_allclose(arrays[f"after/{name}"], want, rtol=1e-5, atol=1e-7)
        assert np.abs(lr * wd * arrays[f"before/{name}"]).max() > 1e-4      # decay is visible
    np.testing.assert_array_equal(arrays["after/1.weight"], arrays["before/1.weight"])
    assert float(arrays["lr_after_step"]) == pytest.approx(0.05)
    np.testing.assert_allclose(arrays["schedule"], [0.1, 0.05, 0.1, 0.0875, 0.075, 0.0625, 0.05,
                                                    0.0375, 0.025, 0.0125, 0.0, 0.0], atol=1e-12)


def test_network_sizes_equal_arcface_torch(computed):
    """Test that mbf, r18, r50 and vit_t at 112 px have arcface_torch's parameter counts and state
    dict lengths (2,059,520 / 333, 24,025,600 / 187, 43,590,848 / 475, 19,137,792 / 150) and give
    512 features in eval and in training mode (vit_t's patch masking and drop path), vit_t's
    state dict in vit.py's order (what copy_state_in_order maps by), and that at
    32 px mbf's GDC kernel covers the 2x2 map (49 - 4 weights fewer per channel)."""
    sizes = json.loads((computed / "networks.json").read_text())
    for name, (params, entries) in ARCFACE_TORCH_SIZES.items():
        assert (sizes[f"{name}/112"]["params"], sizes[f"{name}/112"]["entries"]) == (params, entries)
        assert sizes[f"{name}/112"]["output"] == sizes[f"{name}/112"]["training_output"] == [2, 512]
    # vit.py's order (a module's own parameters first, then its children as registered: Block's
    # norm1, norm2, attn), which copy_state_in_order maps by
    assert sizes["vit_t/112"]["first_entries"] == [
        "pos_embed", "mask_token", "patch_embed.weight", "patch_embed.bias", "blocks.0.norm1.weight",
        "blocks.0.norm1.bias", "blocks.0.norm2.weight", "blocks.0.norm2.bias"]
    assert sizes["mbf/32"]["params"] == 2059520 - 512 * (49 - 4)
    assert sizes["mbf/32"]["output"] == [2, 512]


def test_rec_path_yields_the_in_memory_tensors(computed):
    """Test that the .rec read per item, by a 2-worker DataLoader and into memory all yield the
    stored images as (x / 255 - 0.5) / 0.5 in CHW with their labels (flip off; the header and
    identity records skipped), and that with flip on an image comes out mirrored or not."""
    arrays = np.load(computed / "data.npz")
    want = (arrays["raw"].transpose(0, 3, 1, 2).astype(np.float32) / 255 - 0.5) / 0.5
    assert int(arrays["count"]) == len(want)
    np.testing.assert_array_equal(arrays["item"], want)
    np.testing.assert_array_equal(arrays["item_labels"], arrays["raw_labels"])
    np.testing.assert_array_equal(arrays["memory"], want)
    np.testing.assert_array_equal(arrays["memory_labels"], arrays["raw_labels"])
    by_label = {int(label): image for label, image in zip(arrays["raw_labels"], want)}
    assert sorted(arrays["loader_labels"].tolist()) == sorted(by_label)
    for image, label in zip(arrays["loader"], arrays["loader_labels"]):
        np.testing.assert_array_equal(image, by_label[int(label)])
    mirrored = [np.array_equal(f, want[0][:, :, ::-1]) for f in arrays["flipped"]]
    plain = [np.array_equal(f, want[0]) for f in arrays["flipped"]]
    assert all(m or p for m, p in zip(mirrored, plain)) and any(mirrored) and any(plain)


def test_staged_step_is_the_plain_step_with_the_given_lrs(computed):
    """Test that the step timed by stage (marks after forward, head, backward, clip, update; the
    data wait before) updates exactly as the plain step, that lr_at sets the lr of update 1
    at construction and that of update n + 1 after update n, and that clip_norm 0 leaves the
    gradient unclipped though its norm is above 5."""
    arrays = np.load(computed / "staged.npz")
    assert float(arrays["max_diff"]) == 0.0
    stages = ["forward", "head", "backward", "clip", "update"]
    assert arrays["marks"].tolist() == stages and arrays["clock_stages"].tolist() == stages
    assert arrays["timed_stages"].tolist() == ["data"] + stages and (arrays["timed_seconds"] >= 0).all()
    assert float(arrays["lr_before"]) == 0.3 and float(arrays["lr_after"]) == pytest.approx(0.1)
    assert float(arrays["grad_norm"]) > 5 and float(arrays["unclipped_error"]) < 1e-6


def test_tuned_step_is_the_same_training_in_channels_last_order(computed):
    """Test that the tuned yardstick really holds its convolution weights and batches in
    channels-last order, and trains as arcface_torch as it runs: the same loss (1e-5) and the same
    parameters after a step, to rounding: within 1% of the step's largest change (measured 0.33%;
    the same NCHW step on 1 and on 2 threads differs by 0.1% here: an untrained network's weight
    gradients are sums that mostly cancel). A transposed weight or batch would be off by ~100%."""
    arrays = np.load(computed / "tuned.npz")
    assert bool(arrays["weight_channels_last"]) and bool(arrays["batch_channels_last"])
    np.testing.assert_allclose(arrays["losses"][1], arrays["losses"][0], rtol=1e-5)
    assert float(arrays["max_diff"]) < 1e-2 * float(arrays["largest_change"])


def test_embed_pairs_normalises_as_training_and_sums_the_mirror(computed):
    """Test that embed_pairs feeds (x / 255 - 0.5) / 0.5 in CHW, sums each image's embedding
    with its mirror's (flipped along the width), covers every image across batches, and leaves
    the backbone in the mode it found it in."""
    arrays = np.load(computed / "scoring.npz")
    pixels = (arrays["images"].transpose(0, 3, 1, 2).astype(np.float64) / 255 - 0.5) / 0.5
    weight, bias = arrays["weight"].astype(np.float64), arrays["bias"].astype(np.float64)
    want = (pixels.reshape(7, -1) @ weight.T + bias) + (pixels[:, :, :, ::-1].reshape(7, -1) @ weight.T + bias)
    np.testing.assert_allclose(arrays["embeddings"], want, rtol=1e-4, atol=1e-4)
    assert bool(arrays["training_after"])


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    compute(Path(sys.argv[1]))


def test_without_torch_the_yardstick_says_so_in_one_line():
    """Test that `python -m bench.yardstick --help` where torch cannot be imported ends
    with one line naming PyTorch and how to install it, no traceback, a non-zero exit."""
    run_it = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['yardstick', '--help']; "
              "runpy.run_module('bench.yardstick', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", run_it], capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "PyTorch is not installed" in lines[0] and "scripts/test.sh" in lines[0], lines
