"""What the harness damages and what reads it: formats, commands, and the seeded cases.

A format names the sound file(s) of one kind (a glob in one input group, inputs.GROUPS) and
the commands that read it. A command is a tool's main(argv) (run in a worker process that
imports once) or train.py (run as its own process: Horovod and the run's signals are
process-wide). A case is one damaged copy of one file read by one command; argv holds "{in}"
(the case's copy of the inputs) and "{out}" (an empty folder for outputs).
"""
import fnmatch
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .damage import DAMAGES
from .inputs import TRAIN_SETTINGS

CHECKPOINT = "models/step-00000004"
MODEL_OF_GROUP = {"models": "{in}/models", "mxnet": "{in}/mxnet/model", "torch": "{in}/torch/backbone.pth",
                  "onnx": "{in}/onnx/model.onnx"}


@dataclass(frozen=True)
class Format:
    name: str
    group: str                 # the input group holding the file
    pattern: str               # glob of the file(s), relative to the inputs folder
    commands: tuple
    model_group: str = "models"    # the model the tools load for this format
    checkpoint: bool = False       # a checkpoint file: the checkpoint package's, reported apart


TOOLS_ON_MODELS = ("verify", "embed", "export", "ijb", "train_pretrained")
FORMATS = {f.name: f for f in [
    Format("rec", "data", "data/train.rec", ("train", "plan")),
    Format("idx", "data", "data/train.idx", ("train", "plan")),
    Format("property", "data", "data/property", ("train", "plan")),
    Format("bin", "data", "data/demo_val.bin", ("train", "verify")),
    Format("symbol", "mxnet", "mxnet/model-symbol.json", TOOLS_ON_MODELS, model_group="mxnet"),
    Format("params", "mxnet", "mxnet/model-0004.params", TOOLS_ON_MODELS, model_group="mxnet"),
    Format("pth", "torch", "torch/backbone.pth", TOOLS_ON_MODELS, model_group="torch"),
    Format("onnx", "onnx", "onnx/model.onnx", ("verify", "embed", "ijb", "train_pretrained"), model_group="onnx"),
    Format("ckpt_symbol", "models", f"{CHECKPOINT}/model-symbol.json", ("train_resume", "verify"), checkpoint=True),
    Format("ckpt_params", "models", f"{CHECKPOINT}/model-0004.params", ("train_resume", "verify"), checkpoint=True),
    Format("state", "models", f"{CHECKPOINT}/state.json", ("train_resume", "verify"), checkpoint=True),
    Format("rank_state", "models", f"{CHECKPOINT}/rank*.json", ("train_resume",), checkpoint=True),
    Format("bank_npy", "models", f"{CHECKPOINT}/bank-rank*.npy", ("train_resume",), checkpoint=True),
    Format("bank_json", "models", f"{CHECKPOINT}/bank-rank*.json", ("train_resume",), checkpoint=True),
    Format("optimizer", "models", f"{CHECKPOINT}/optimizer.params", ("train_resume",), checkpoint=True),
    Format("aux", "models", f"{CHECKPOINT}/aux-rank*.params", ("train_resume",), checkpoint=True),
    Format("complete", "models", f"{CHECKPOINT}/COMPLETE", ("train_resume", "verify"), checkpoint=True),
    Format("image", "faces", "faces/*/*", ("pack", "embed")),
]}

TOOL_MODULES = {name: f"sample_fc.tools.{name}" for name in ("verify", "embed", "export", "ijb", "plan", "pack")}
TRAIN_COMMANDS = ("train", "train_resume", "train_pretrained")


def command_argv(command, model):
    """(argv after the program, the input groups it reads besides the format's) of a command."""
    train_fresh = ["--models-root", "{out}/models", "--set", "rec={in}/data/train.rec", *TRAIN_SETTINGS]
    return {
        "verify": (["--model", model, "--bin", "{in}/data/demo_val.bin", "--no-progress"], ("data",)),
        "embed": (["--model", model, "--images", "{in}/faces", "--out", "{out}/emb.npy", "--no-progress"], ("faces",)),
        "export": (["--model", model, "--onnx", "{out}/model.onnx", "--check-batches", "1"], ()),
        "ijb": (["--model", model, "--root", "{in}/ijb/IJBC", "--out", "{out}/ijb", "--no-progress"], ("ijb",)),
        "plan": (["--set", "rec={in}/data/train.rec", "--network", "mbf_small", "-np", "1",
                  "--models-root", "{out}/models"], ()),
        "pack": (["--images", "{in}/faces", "--out", "{out}/packed/train", "--image-size", "32"], ()),
        "train": (train_fresh, ()),
        "train_pretrained": (train_fresh + ["--pretrained", model], ("data",)),
        "train_resume": (["--resume", "{in}/models", "--set", "max_update=5", "--set", "ckpt_period=100"], ()),
    }[command]


@dataclass
class Case:
    id: int
    format: str
    command: str
    damage: str
    seed: int                  # the case is (seed, id): np.random.default_rng((seed, id))
    file: str = ""             # the damaged file, relative to the inputs folder
    argv: list = field(default_factory=list)
    groups: tuple = ()         # input groups copied into the case

    def to_json(self):
        return asdict(self)


def matching_files(inputs, pattern):
    """Files under `inputs` matching the glob `pattern` (relative, '/'-separated), sorted."""
    found = []
    for parent, _, names in os.walk(inputs):
        for name in names:
            relative = os.path.relpath(os.path.join(parent, name), inputs).replace(os.sep, "/")
            if fnmatch.fnmatch(relative, pattern):
                found.append(relative)
    return sorted(found)


def make_cases(inputs, count, seed, formats=None, commands=None):
    """`count` cases spread evenly over the (format, command) pairs asked for, in a
    deterministic order; each case's file and damage drawn from its own generator."""
    pairs = [(f, c) for f in (formats or FORMATS) for c in FORMATS[f].commands if not commands or c in commands]
    if not pairs:
        raise ValueError(f"no format reads with commands {commands}")
    cases = []
    for i in range(count):
        fmt, command = FORMATS[pairs[i % len(pairs)][0]], pairs[i % len(pairs)][1]
        rng = np.random.default_rng((seed, i))
        files = matching_files(inputs, fmt.pattern)
        if not files:
            raise FileNotFoundError(f"format {fmt.name}: no sound file matches {fmt.pattern} in {inputs}")
        model = MODEL_OF_GROUP[fmt.model_group]
        argv, groups = command_argv(command, model)
        needed = {fmt.group, *groups}
        if command in TOOLS_ON_MODELS:
            needed.add(fmt.model_group)
        if command in TRAIN_COMMANDS:
            needed.add("data")
        cases.append(Case(i, fmt.name, command, str(rng.choice(sorted(DAMAGES))), seed,
                          files[int(rng.integers(len(files)))], argv, tuple(sorted(needed))))
    return cases


def swap_partner(inputs, case, rng):
    """A sound file of another format, for the `swap` damage."""
    others = [f for name, f in sorted(FORMATS.items()) if name != case.format]
    fmt = others[int(rng.integers(len(others)))]
    files = matching_files(inputs, fmt.pattern)
    return files[int(rng.integers(len(files)))]
