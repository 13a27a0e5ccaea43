"""Ours against arcface_torch's own modules: same outputs from the same weights, then speed.

forward_check: their network's weights loaded into ours (entry by entry), the same input
through both, in eval and in training mode (batch statistics). step_check: one full training
step of each side from the same weights, centers, batch and random state (the sampling draws
the same scores), then the loss and every updated parameter compared. alternate_timing: each
side's full steps timed in turn, the order swapped every round, on one process and the same
threads, so load from other work falls on both.
"""
import copy
import time

import torch

from .networks import EMBEDDING_SIZE, parameter_count
from .training import PartialFC, Trainer
from .upstream import UpstreamTrainer, copy_state_in_order


def max_abs_difference(a, b):
    return float((a - b).abs().max())


def forward_check(theirs, ours, image_size, batch=4, seed=0):
    """Max |theirs - ours| of the embeddings in eval and train mode, and both parameter counts."""
    pairs = copy_state_in_order(theirs, ours)
    images = torch.randn(batch, 3, image_size, image_size, generator=torch.Generator().manual_seed(seed))
    result = {"state_entries": len(pairs), "first_pair": pairs[0], "last_pair": pairs[-1],
              "params_theirs": parameter_count(theirs),
              "params_ours": parameter_count(ours)}
    with torch.no_grad():
        for mode in ("eval", "train"):
            theirs.train(mode == "train")
            ours.train(mode == "train")
            result[f"max_abs_{mode}"] = max_abs_difference(theirs(images), ours(images))
    return result


def step_check(modules, their_net, our_net, images, labels, num_classes, sample_rate, margin,
               lr, weight_decay, wrap=lambda backbone: backbone, seed=0):
    """One training step each from equal states (each backbone through `wrap`, e.g. DDP):
    |loss difference| and max |parameter difference| after the update."""
    their_net, our_net = copy.deepcopy(their_net), copy.deepcopy(our_net)
    copy_state_in_order(their_net, our_net)
    theirs = UpstreamTrainer(modules, wrap(their_net), num_classes, sample_rate, margin, lr, weight_decay)
    head = PartialFC(margin, EMBEDDING_SIZE, num_classes, sample_rate)
    with torch.no_grad():
        head.weight.copy_(theirs.head.weight)
    ours = Trainer(wrap(our_net), head, lr, weight_decay)
    torch.manual_seed(seed)
    their_loss = theirs.step(images, labels.clone())
    torch.manual_seed(seed)
    our_loss = ours.step(images, labels.clone())
    their_params = list(their_net.parameters()) + [theirs.head.weight]
    our_params = list(our_net.parameters()) + [head.weight]
    worst = max(max_abs_difference(a.detach(), b.detach()) for a, b in zip(their_params, our_params))
    centers = max_abs_difference(theirs.head.weight.detach(), head.weight.detach())
    return {"loss_theirs": float(their_loss), "loss_ours": float(our_loss),
            "loss_abs_diff": abs(float(their_loss) - float(our_loss)),
            "max_abs_param_diff": worst, "max_abs_center_diff": centers}


def alternate_timing(runners, batch_size, steps, rounds, warmup=2):
    """Per round and runner, samples per wall second and per CPU second of this process (all
    its threads; less moved by other work taking the cores). runners: name -> (trainer, batches)."""
    for trainer, batches in runners.values():
        for _ in range(warmup):
            trainer.step(*next(batches))
    wall, cpu = {name: [] for name in runners}, {name: [] for name in runners}
    names = list(runners)
    for round_index in range(rounds):
        for name in (names if round_index % 2 == 0 else names[::-1]):
            trainer, batches = runners[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                trainer.step(*next(batches))
            wall[name].append(steps * batch_size / (time.perf_counter() - start))
            cpu[name].append(steps * batch_size / (time.process_time() - start_cpu))
    return wall, cpu
