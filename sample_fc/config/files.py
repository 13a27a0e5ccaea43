"""A config's files: JSON written atomically and read back, and its lines for the log."""
import json
import os
import uuid

from easydict import EasyDict

from ..errors import UsageError


def save_config(cfg, path):
    """Write cfg as JSON to path atomically (see write_json)."""
    write_json(path, cfg)


def json_text(payload):
    """The project's JSON file text of `payload`: sorted keys, indent 2, a final newline."""
    return json.dumps(payload, sort_keys=True, indent=2) + '\n'


def write_json(path, payload):
    """Write payload as JSON (sorted keys, indent 2) to path atomically (write_text)."""
    write_text(path, json_text(payload))        # the text fails before touching disk


def write_text(path, text):
    """Write `text` to path atomically: a temporary file in the same directory, synced, then
    os.replace. The directory must exist."""
    path = os.fspath(path)
    directory, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{base}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, 'x', encoding='utf-8') as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_config(path):
    """Read a config written by save_config as an EasyDict."""
    with open(path, encoding='utf-8') as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise UsageError(f"config file {os.fspath(path)!r} holds a {type(data).__name__}, "
                         "expected a JSON object")
    return EasyDict(data)


def format_config(cfg):
    """Return "key: value" lines (insertion order) for logging."""
    rows = list(cfg.items())
    width = max((len(k) for k, _ in rows), default=0)
    return '\n'.join(f"{k + ':':<{width + 1}} {v!r}" for k, v in rows)
