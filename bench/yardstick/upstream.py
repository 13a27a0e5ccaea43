"""arcface_torch's own modules, imported at run time from a directory the user gives, run on CPU.

Nothing of theirs is stored here: `load(directory)` imports backbones/, partial_fc_v2.py,
losses.py and lr_scheduler.py from a checkout of insightface recognition/arcface_torch. Their
training step needs three things this CPU process lacks, and gets them here:
- PartialFC_V2 asserts an initialised process group and moves buffers with `.cuda()` every
  step: a one-process Gloo group is started, and Tensor.cuda returns the tensor itself (in
  this process only; sample_fc's yardstick never calls it).
- lr_scheduler.py's PolynomialLRWarmup passes `verbose` to a base that no longer takes it
  (torch 2.13 here): its base is initialised without it (polynomial_warmup).
- Their networks are fixed to 112 px (mbf's GDC kernel 7x7, IResNet's fc over 7x7 maps, the
  ViTs' img_size=112): for another size the GDC's conv is replaced by one whose kernel covers
  the final map, IResNet.fc_scale is set to that map's area while the network is built
  (networks.final_side), and a ViT is built with img_size the image's side.
- vit.py imports three helpers of timm (DropPath, to_2tuple, trunc_normal_), which is not
  installed here: stand-ins are registered as timm.models.layers when timm is missing
  (networks.DropPath, torch's trunc_normal_, a pair of a number).
"""
import importlib.util
import os
import sys
import types
import warnings

import torch
from torch import nn

from .networks import EMBEDDING_SIZE, SEP_CHANNELS, DropPath, final_side
from .training import CLIP_NORM, MOMENTUM, start_one_process_group

FILES = ("backbones/__init__.py", "partial_fc_v2.py", "losses.py", "lr_scheduler.py")


def _import(name, path, package_dir=None):
    """The module `name` executed afresh from `path` (a package when package_dir is given). Its
    submodules of an earlier import are dropped first: Python binds a submodule to its package
    only when it first imports it, so a fresh package beside an old `name.iresnet` would lack
    the attribute `iresnet` (a second load() in one process: compare's tuned run after as-shipped)."""
    for stale in [key for key in sys.modules if key.startswith(name + ".")]:
        del sys.modules[stale]
    locations = [package_dir] if package_dir else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=locations)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def missing_files(directory):
    """The files of arcface_torch the yardstick imports that `directory` lacks."""
    return [f for f in FILES if not os.path.isfile(os.path.join(directory, f))]


def not_arcface_torch(option, directory):
    """None, or the one line saying why `directory` (given as `option`) is not arcface_torch."""
    missing = missing_files(directory)
    return f"{option} {directory} is not arcface_torch: no {', '.join(missing)}" if missing else None


def _timm_stand_ins():
    """timm.models.layers' DropPath, to_2tuple and trunc_normal_ (vit.py's imports), registered
    in sys.modules when timm is not installed."""
    try:
        import timm.models.layers  # noqa: F401
        return
    except ImportError:
        pass
    layers = types.ModuleType("timm.models.layers")
    layers.DropPath, layers.trunc_normal_ = DropPath, nn.init.trunc_normal_
    layers.to_2tuple = lambda value: tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    models, timm = types.ModuleType("timm.models"), types.ModuleType("timm")
    models.layers, timm.models = layers, models
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers})


def load(directory):
    """Their modules as attributes backbones, partial_fc_v2, losses, lr_scheduler."""
    missing = missing_files(directory)
    if missing:
        raise FileNotFoundError(f"{directory} is not arcface_torch: no {', '.join(missing)}")
    _timm_stand_ins()
    warnings.filterwarnings("ignore", message=r".*torch\.cuda\.amp\.autocast.*", category=FutureWarning)
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    start_one_process_group()
    backbones_dir = os.path.join(directory, "backbones")
    return types.SimpleNamespace(
        backbones=_import("arcface_torch_backbones", os.path.join(backbones_dir, "__init__.py"), backbones_dir),
        partial_fc_v2=_import("arcface_torch_partial_fc_v2", os.path.join(directory, "partial_fc_v2.py")),
        losses=_import("arcface_torch_losses", os.path.join(directory, "losses.py")),
        lr_scheduler=_import("arcface_torch_lr_scheduler", os.path.join(directory, "lr_scheduler.py")))


def build_network(modules, name, image_size, embedding_size=EMBEDDING_SIZE):
    """get_model(name, dropout=0.0, fp16=False, num_features=embedding_size), fitted to `image_size`."""
    if name.startswith("vit"):
        vit = importlib.import_module("arcface_torch_backbones.vit")
        built_at_112 = vit.VisionTransformer
        vit.VisionTransformer = lambda *args, **kwargs: built_at_112(*args, **{**kwargs, "img_size": image_size})
        try:
            return modules.backbones.get_model(name, dropout=0.0, fp16=False, num_features=embedding_size)
        finally:
            vit.VisionTransformer = built_at_112
    side = final_side(image_size)
    iresnet_class = modules.backbones.iresnet.IResNet
    fixed_area = iresnet_class.fc_scale
    iresnet_class.fc_scale = side * side
    try:
        model = modules.backbones.get_model(name, dropout=0.0, fp16=False, num_features=embedding_size)
    finally:
        iresnet_class.fc_scale = fixed_area
    if name == "mbf" and side != 7:
        gdc_block = model.features.layers[0].layers
        conv = nn.Conv2d(SEP_CHANNELS, SEP_CHANNELS, side, groups=SEP_CHANNELS, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        gdc_block[0] = conv
    return model


def partial_fc(modules, margin, embedding_size, num_classes, sample_rate):
    """Their PartialFC_V2 (fp16 off) with their CombinedMarginLoss for `margin` (training.CombinedMargin's
    values): head(embeddings, labels) -> the loss, its centers `weight`."""
    loss = modules.losses.CombinedMarginLoss(margin.scale, margin.m1, margin.m2, margin.m3, margin.filter_threshold)
    return modules.partial_fc_v2.PartialFC_V2(loss, embedding_size, num_classes, sample_rate, False)


def copy_state_in_order(source, target):
    """Load `source`'s state dict into `target`, entry i to entry i; the (theirs, ours) name pairs."""
    theirs, ours = list(source.state_dict().items()), list(target.state_dict().items())
    if len(theirs) != len(ours):
        raise ValueError(f"state dicts differ in length: {len(theirs)} entries vs {len(ours)}")
    mapped, pairs = {}, []
    for (their_name, value), (our_name, slot) in zip(theirs, ours):
        if value.shape != slot.shape:
            raise ValueError(f"{their_name} {tuple(value.shape)} does not fit {our_name} {tuple(slot.shape)}")
        mapped[our_name] = value.clone()
        pairs.append((their_name, our_name))
    target.load_state_dict(mapped)
    return pairs


def polynomial_warmup(modules, optimizer, warmup_steps, total_steps):
    """Their PolynomialLRWarmup (its get_lr each step). Its __init__ passes `verbose`, which
    torch >= 2.7's LRScheduler no longer takes: the base is initialised here without it."""
    scheduler_class = modules.lr_scheduler.PolynomialLRWarmup
    scheduler = scheduler_class.__new__(scheduler_class)
    torch.optim.lr_scheduler.LRScheduler.__init__(scheduler, optimizer)
    scheduler.total_iters, scheduler.power, scheduler.warmup_iters = total_steps, 1.0, warmup_steps
    return scheduler


class UpstreamTrainer:
    """train_v2.py's loop body (fp16 off, gradient_acc 1) with their PartialFC_V2, margin and schedule."""

    def __init__(self, modules, backbone, num_classes, sample_rate, margin, lr, weight_decay,
                 total_steps=10 ** 9):
        self.backbone = backbone.train()
        self.head = partial_fc(modules, margin, EMBEDDING_SIZE, num_classes, sample_rate).train()
        self.optimizer = torch.optim.SGD(
            params=[{"params": backbone.parameters()}, {"params": self.head.parameters()}],
            lr=lr, momentum=MOMENTUM, weight_decay=weight_decay)
        self.scheduler = polynomial_warmup(modules, self.optimizer, 0, total_steps)

    def step(self, images, labels):
        loss = self.head(self.backbone(images), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.backbone.parameters(), CLIP_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        return loss.detach()
