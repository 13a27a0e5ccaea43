"""An experiment as one small file: `train.py --config FILE` (and tools.plan's), holding only a
run's differences from its presets, one `key = value` per line:

    # glyphs20k.cfg: 20,000 glyph identities, one worker of 128
    dataset = custom
    rec = /data/glyphs20k/train.rec
    val_targets = ["glyphs_val"]
    batch_size = 128
    bank_momentum = none

A line says what `--set key=value` says, with the same declared types and one-line errors (the
file and line in front); `dataset`, `network` and `loss` choose presets as the options of those
names do; a value may stand in quotes. The command line wins: its --dataset/--network/--loss over
the file's, its --set after the file's lines. Blank lines and `#` comments are skipped; a key given
twice is refused. A run keeps a copy of the file in its models root (run_root.EXPERIMENT_FILE).
"""
import os
from dataclasses import dataclass

from ..config import DATASETS, KEYS, LOSSES, NETWORKS, apply_overrides, renamed_overrides
from ..errors import UsageError

PRESET_KEYS = ("dataset", "network", "loss")
MAX_BYTES = 1 << 20              # an experiment is a few lines; a larger file is not one


@dataclass(frozen=True)
class ExperimentFile:
    path: str
    text: str
    presets: dict                # {dataset|network|loss: word} the file names
    overrides: tuple             # ("key=value", ...) in the file's order, for config_for_run

    def merged_into(self, args):
        """train.py's or tools.plan's parsed `args` with this file under them: its presets where
        the command line names none, its lines before the command line's --set."""
        for key, word in self.presets.items():
            if getattr(args, key, None) is None:
                setattr(args, key, word)
        args.overrides = list(self.overrides) + list(args.overrides)
        return args


def read_experiment(path):
    """The ExperimentFile at `path`, every line checked as --set checks it (the key table's types;
    a preset name among the presets'; an old key name is read as its new one, which config_for_run
    notes). UsageError naming the file, the line and
    what is wrong, before anything is trained or written."""
    text = _text_of(path)
    presets, overrides, seen = {}, [], {}
    choices = {"dataset": DATASETS, "network": NETWORKS, "loss": LOSSES}
    for number, line in enumerate(text.splitlines(), 1):
        content = _without_comment(line)
        if not content:
            continue
        where = f"--config {path}, line {number}"
        key, sep, value = content.partition("=")
        key, value = key.strip(), _unquoted(value.strip())
        if not sep or not key:
            raise UsageError(f"{where}: {content!r} is not a `key = value` line")
        current = renamed_overrides([f"{key}={value}"])[0].split("=", 1)[0]    # an old name's
        if current in seen:
            raise UsageError(f"{where}: {current} is set twice (line {seen[current]} sets it too)")
        seen[current] = number
        if key in PRESET_KEYS:
            if value not in choices[key]:
                raise UsageError(f"{where}: {key} = {value!r}; expected one of: {', '.join(choices[key])}")
            presets[key] = value
            continue
        try:
            apply_overrides({}, [f"{current}={value}"], KEYS)
        except UsageError as error:
            raise UsageError(f"{where}: {error}") from None
        overrides.append(f"{key}={value}")
    return ExperimentFile(os.fspath(path), text, presets, tuple(overrides))


def _without_comment(line):
    """The line up to its comment: a `#` at its start or after a space, outside a pair of quotes
    (so a path such as /data/set#2 or a quoted "a # b" keeps its `#`; a quote never closed is a
    character like any other), stripped."""
    position = 0
    while position < len(line):
        char = line[position]
        if char in "\"'" and line.find(char, position + 1) > 0:
            position = line.find(char, position + 1) + 1
            continue
        if char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position].strip()
        position += 1
    return line.strip()


def _unquoted(value):
    """A value in one pair of matching quotes without them ("/data/my set" is /data/my set, as
    the shell gives --set); anything else as written."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" and value[0] not in value[1:-1]:
        return value[1:-1]
    return value


def _text_of(path):
    """The file's text; UsageError for a missing, unreadable, binary or oversized file."""
    label = f"--config {path}"
    if not os.path.exists(path):
        raise UsageError(f"{label}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"{label} is a directory; expected a file of `key = value` lines")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as error:
        raise UsageError(f"{label}: cannot read it ({error.strerror})") from None
    if len(data) > MAX_BYTES:
        raise UsageError(f"{label} is over {MAX_BYTES >> 20} MB; expected a few `key = value` lines")
    try:
        return data.decode("utf-8-sig")        # a byte-order mark some editors write is not text
    except UnicodeDecodeError:
        raise UsageError(f"{label} is not UTF-8 text; expected `key = value` lines") from None
