"""The yardstick's side of bench.compare: arcface_torch's training step (bench/yardstick/) on
sample_fc's resolved recipe, in compare's process, with its data decoded from the .rec by its
DataLoader or held in memory; and the recipe numbers only sample_fc's own code computes.
"""
import json
import os
import subprocess
import sys
import time

from easydict import EasyDict

from sample_fc.config import bank_setting, scaled_lr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEED_SKIP_STEPS = 20      # samples/s is measured over the steps after these (start-up, first oneDNN primitives)


# sample_fc's numbers the yardstick needs that only sample_fc's own code computes; run in a
# process of its own: sample_fc.optimizers loads Horovod, and torch may not share a process with it
RECIPE_NUMBERS = """
import json, sys
from easydict import EasyDict
from sample_fc.builder import resolve_auto
from sample_fc.config import scaled_lr
from sample_fc.optimizers import schedule_of
cfg, world = EasyDict(json.load(sys.stdin)), int(sys.argv[1])
resolve_auto(cfg, world)
schedule = schedule_of(cfg, scaled_lr(cfg, cfg.batch_size * world))
print(json.dumps({"sample_ratio": cfg.sample_ratio, "lrs": [schedule(n) for n in range(1, cfg.max_update + 1)]}))
"""


def recipe_numbers(cfg, world):
    """{'sample_ratio': the number train.py trains with (auto resolved), 'lrs': the lr of each
    update 1..max_update}, computed by sample_fc's own builder.resolve_auto and schedule_of."""
    result = subprocess.run([sys.executable, "-c", RECIPE_NUMBERS, str(world)], input=json.dumps(cfg), cwd=ROOT,
                            capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"compare: error: sample_fc's lr schedule: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout)


def yardstick_recipe(cfg, world, sample_ratio):
    """The yardstick's settings for sample_fc's resolved config on `world` workers (no torch here):
    the same network, shapes, global batch, lr (scaled as train.py scales it), optimizer, weight
    decay, margins and scale (SGD's momentum: arcface_torch's fixed 0.9, which yardstick_refusal
    holds the recipe to). With optimizer=adamw the yardstick's centers train under AdamW too, as
    arcface_torch's do (sample_fc's bank keeps SGD: bank_lr, bank_wd)."""
    global_batch = cfg.batch_size * world
    return EasyDict(network=cfg.network, image_size=cfg.image_size, embedding_size=cfg.embedding_size,
                    classes=cfg.num_classes, global_batch=global_batch, steps=cfg.max_update,
                    lr=scaled_lr(cfg, global_batch), optimizer=cfg.optimizer,
                    bank_lr=scaled_lr(cfg, global_batch, "bank"), bank_wd=bank_setting(cfg, "wd"),
                    weight_decay=cfg.wd, margins=(cfg.loss_m1, cfg.loss_m2, cfg.loss_m3),
                    scale=cfg.loss_s, sample_rate=float(sample_ratio), seed=cfg.seed)


def yardstick_refusal(cfg):
    """None, or the one line saying why the yardstick cannot train cfg's recipe (imports torch)."""
    from .yardstick import CombinedMargin
    from .yardstick.networks import NETWORKS
    from .yardstick.training import MOMENTUM
    if cfg.network not in NETWORKS:
        return (f"the yardstick has no network {cfg.network!r}; arcface_torch's networks it has: "
                f"{', '.join(NETWORKS)} (--network NAME)")
    if cfg.optimizer == "sgd" and cfg.momentum != MOMENTUM:
        return (f"momentum={cfg.momentum:g}, but arcface_torch's train_v2.py fixes SGD momentum at {MOMENTUM:g} "
                f"(--set momentum={MOMENTUM:g})")
    if cfg.loss_margin != "combined":
        return (f"loss_margin={cfg.loss_margin}: arcface_torch's CombinedMarginLoss has only the combined margin "
                f"(--loss arcface or cosface, or --only sample_fc)")
    try:
        CombinedMargin(cfg.loss_s, cfg.loss_m1, cfg.loss_m2, cfg.loss_m3)
    except ValueError as error:
        return f"loss {cfg.loss}: {error}"
    return None


def first_image_side(folder):
    """Height of the .rec's first image, read with PIL: decoding with MXNet in this process
    before the DataLoader forks its workers would start MXNet's threads here and hang them."""
    import io
    import mxnet as mx
    from PIL import Image
    from .yardstick.data import image_indices, open_record
    record = open_record(folder)
    _, payload = mx.recordio.unpack(record.read_idx(int(image_indices(record)[0])))
    record.close()
    return Image.open(io.BytesIO(payload)).size[1]


MALLOC_SETTINGS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


def malloc_note():
    """'; glibc malloc: K=V, ...' for the glibc settings in the environment (both sides inherit
    them), else ''. PyTorch on the CPU allocates a step's large tensors with malloc: by default
    glibc maps and unmaps each one, and at 112 px the page faults took ~40% of the yardstick's
    CPU time here (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large> keeps the memory)."""
    found = [f"{key}={os.environ[key]}" for key in MALLOC_SETTINGS if key in os.environ]
    return f"; glibc malloc: {', '.join(found)}" if found else ""


def yardstick_data_layout(torch_data):
    """How the yardstick's side gets its images (--torch-data rec or memory), in words."""
    from .yardstick.data import LOADER_WORKERS
    if torch_data == "memory":
        return "data decoded once into memory, no loader workers"
    return f"DataLoader with {LOADER_WORKERS} worker processes decoding the .rec per step, 1 prefetch thread"


def yardstick_batches(args, recipe, rec_folder, memory=False):
    """(endless (images, labels) batches, a close() for them, the data's layout line); `memory`:
    decoded once into memory whatever --torch-data says."""
    from .yardstick import MemoryFaces, RecFaces, rec_loader
    from .yardstick.data import LOADER_WORKERS, Prefetched
    dataset = RecFaces(rec_folder)
    side = first_image_side(rec_folder)
    if side != recipe.image_size:
        sys.exit(f"compare: {rec_folder} holds {side} px images and the recipe trains at image_size="
                 f"{recipe.image_size}; the yardstick does not resize (--set image_size={side})")
    if memory or args.torch_data == "memory":
        faces = MemoryFaces.from_rec(rec_folder)
        return (faces.batches(recipe.global_batch, seed=recipe.seed), lambda: None,
                f"{yardstick_data_layout('memory')} ({len(faces.labels)} images)")
    loader = Prefetched(rec_loader(dataset, recipe.global_batch, LOADER_WORKERS, seed=recipe.seed))
    return loader, loader.close, yardstick_data_layout("rec")


def rate_after(step_ends, skip, global_batch):
    """Samples/s over the steps after the first `skip`; step_ends[n]: the time step n ended
    (step_ends[0]: the start). None when there are no such steps."""
    steps = len(step_ends) - 1 - skip
    if steps < 1:
        return None
    return steps * global_batch / (step_ends[-1] - step_ends[skip])


def run_torch(args, cfg, tuned=False):
    """Train the yardstick on cfg's recipe in this process (with args.arcface_torch: from
    arcface_torch's own backbone and head modules in that directory); return ([(step, loss)],
    {target: accuracy}, samples/s, accuracy curve, [center_probe statistics]) as run_sample_fc does.
    Verification (with --eval-every) stops the clock: step_ends hold training time only. `tuned`:
    as a skilled CPU user runs it (yardstick/tuned.py: channels-last model and batches, images in memory)."""
    import mxnet  # noqa: F401  (the .rec reader's; importing it leaves torch 1 thread: set them after)
    import torch
    from sample_fc.data.bin_format import load_bin
    from sample_fc.verification import score
    from sample_fc.run.center_probe import center_motion, probe_rows
    from .yardstick import CombinedMargin, PartialFC, Trainer, build_network, upstream
    from .yardstick.scoring import embed_pairs
    from .yardstick.tuned import channels_last, channels_last_batches
    numbers = recipe_numbers(cfg, args.np)
    recipe = yardstick_recipe(cfg, args.np, numbers["sample_ratio"])
    rec = cfg.rec if os.path.isabs(cfg.rec) else os.path.join(ROOT, cfg.rec)
    if args.torch_np > 1:
        return run_torch_ddp(args, cfg, recipe, numbers["lrs"], rec)
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(recipe.seed)
    margin = CombinedMargin(recipe.scale, *recipe.margins)
    if args.arcface_torch:                # their own backbone, PartialFC_V2 and CombinedMarginLoss
        modules = upstream.load(args.arcface_torch)
        backbone = upstream.build_network(modules, recipe.network, recipe.image_size, recipe.embedding_size)
        head = upstream.partial_fc(modules, margin, recipe.embedding_size, recipe.classes, recipe.sample_rate)
    else:
        backbone = build_network(recipe.network, recipe.image_size, recipe.embedding_size)
        head = PartialFC(margin, recipe.embedding_size, recipe.classes, recipe.sample_rate)
    backbone = channels_last(backbone) if tuned else backbone
    name = "tuned" if tuned else "yardstick"
    lrs = numbers["lrs"]
    centers_sgd = (recipe.bank_lr / recipe.lr, recipe.bank_wd) if args.torch_centers == "bank" else None
    trainer = Trainer(backbone, head, recipe.lr, recipe.weight_decay, lr_at=lambda n: lrs[min(n, len(lrs)) - 1],
                      clip_norm=args.torch_clip, optimizer=recipe.optimizer, centers_sgd=centers_sgd)
    # the loader last: its workers fork from this process while nothing else runs in it
    batches, close, data_layout = yardstick_batches(args, recipe, os.path.dirname(rec), memory=tuned)
    batches = channels_last_batches(batches) if tuned else batches
    print(f"{name}: {recipe.network} {recipe.image_size} px, global batch {recipe.global_batch}, {recipe.optimizer} "
          f"lr {recipe.lr:g} ({cfg.lr_schedule} schedule), wd {recipe.weight_decay:g} on every parameter, "
          f"margins {recipe.margins} "
          f"s {recipe.scale:g}, sample rate {recipe.sample_rate:g}, clip {args.torch_clip:g}"
          + (f"; the centers on SGD at lr {recipe.bank_lr:g}, wd {recipe.bank_wd:g} (--torch-centers bank)"
             if centers_sgd else ""), flush=True)
    print(f"{name} layout: 1 process, {torch.get_num_threads()} torch threads; {data_layout}"
          + ("; channels-last model and batches" if tuned else "")
          + (f"; arcface_torch's own modules from {args.arcface_torch}" if args.arcface_torch else ""), flush=True)
    target = cfg.val_targets[0]
    images, issame = load_bin(os.path.join(os.path.dirname(rec), target + ".bin"), cfg.image_size)
    losses, window, curve, paused, centers = [], [], [], 0.0, []
    probe = torch.from_numpy(probe_rows(recipe.classes))       # center_probe's rows, as sample_fc reads them
    step_ends = [time.perf_counter()]
    for step in range(1, recipe.steps + 1):
        before = head.weight.detach()[probe].numpy().copy() if step % cfg.frequent == 0 else None
        window.append(float(trainer.step(*next(batches))))
        step_ends.append(time.perf_counter() - paused)
        if step % cfg.frequent == 0 or step == recipe.steps:
            losses.append((step, sum(window) / len(window)))
            if before is not None:
                centers.append(dict(center_motion(before, head.weight.detach()[probe].numpy()), step=step))
            print(f"  {name} step {step}/{recipe.steps}  loss {losses[-1][1]:.4f}", flush=True)
            window = []
        if args.eval_every and (step % args.eval_every == 0 or step == recipe.steps):
            started = time.perf_counter()
            curve.append((step, step_ends[-1] - step_ends[0], score(embed_pairs(backbone, images), issame).accuracy))
            print(f"  {name} step {step} {target} accuracy {curve[-1][2]:.4f}", flush=True)
            paused += time.perf_counter() - started
    close()
    speed = rate_after(step_ends, SPEED_SKIP_STEPS, recipe.global_batch)
    accuracy = curve[-1][2] if curve else score(embed_pairs(backbone, images), issame).accuracy
    print(f"  {name} {target} accuracy {accuracy:.4f}, {speed or 0:.1f} samples/s", flush=True)
    return losses, {target: accuracy}, speed, curve, centers


def run_torch_ddp(args, cfg, recipe, lrs, rec):
    """The yardstick as args.torch_np DDP processes (yardstick/ddp.py); returns what run_torch does
    (no speed: the processes' start-up is in their time)."""
    from .yardstick.ddp import run_ddp
    target = cfg.val_targets[0]
    threads = max(1, args.torch_threads // args.torch_np)
    print(f"yardstick: {recipe.network} {recipe.image_size} px, global batch {recipe.global_batch} as "
          f"{args.torch_np} DDP processes x {recipe.global_batch // args.torch_np} images x {threads} torch threads, "
          f"lr {recipe.lr:g}, wd {recipe.weight_decay:g} on every parameter, "
          f"margins {recipe.margins} s {recipe.scale:g}",
          flush=True)
    result = run_ddp(recipe, lrs, os.path.dirname(rec), args.torch_np, threads,
                     os.path.join(os.path.dirname(rec), target + ".bin"))
    every_step = result["losses"]
    ends = sorted(set(range(cfg.frequent, recipe.steps + 1, cfg.frequent)) | {recipe.steps})
    losses = [(end, sum(every_step[start:end]) / (end - start)) for start, end in zip([0] + ends, ends)]
    print(f"  yardstick {target} accuracy {result['accuracy']:.4f} (rank 0's BatchNorm statistics)", flush=True)
    return losses, {target: result["accuracy"]}, None, [], []
