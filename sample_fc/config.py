"""Generic config helpers: typed `key=value` overrides, JSON save/load, log formatting.

Nothing here knows which keys a config has. The rule these helpers enforce: an override
may only set a key that already exists, to a value of the existing value's type.

    cfg = apply_overrides(cfg, ['lr=0.2', 'lr_steps=100,200', 'fp16=true'])
"""
import difflib
import json
import os
import uuid

from easydict import EasyDict

from .errors import UsageError

_TRUE = ('true', '1', 'yes')
_FALSE = ('false', '0', 'no')


def parse_override(text):
    """Split "key=value" at the first '=' into (key, raw_value); the value may be empty.

    Raises UsageError naming the text when there is no '=' or the key is empty.
    """
    key, sep, raw = text.partition('=')
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"malformed override {text!r}: expected key=value")
    return key, raw


def _unknown_key(cfg, key):
    valid = list(cfg)
    close = difflib.get_close_matches(key, valid, n=1)
    if close:
        return UsageError(f"unknown config key {key!r}; did you mean {close[0]!r}?")
    return UsageError(f"unknown config key {key!r}; valid keys: {', '.join(valid)}")


def _bad(key, raw, expected):
    return UsageError(f"bad value for config key {key!r}: {raw!r} is not {expected}")


def _to_scalar(key, raw, kind):
    """Convert the string raw to bool, int, float or str; UsageError on mismatch."""
    text = raw.strip()
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise _bad(key, raw, "a bool (true/false, 1/0, yes/no)")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise _bad(key, raw, "an int") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise _bad(key, raw, "a float") from None
    if kind is str:
        return raw
    raise UsageError(f"config key {key!r} holds a {kind.__name__}; overrides support "
                     "bool, int, float, str, None and lists of those")


def _infer_scalar(text):
    """Type a list element of an empty list: int, then float, then str."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _to_element(key, raw, item, kind):
    """Convert one list element (a string, or a JSON-decoded value) to kind."""
    if kind is None:  # existing list was empty: keep JSON types, infer from strings
        return _infer_scalar(item.strip()) if isinstance(item, str) else item
    if isinstance(item, str):
        try:
            return _to_scalar(key, item, kind)
        except ValueError:
            raise _bad(key, raw, f"a list of {kind.__name__} (element {item!r})") from None
    if type(item) is kind or (kind is float and type(item) is int):
        return kind(item)
    raise _bad(key, raw, f"a list of {kind.__name__} (element {item!r})")


def _to_list(key, raw, current):
    """Parse a JSON list ("[1, 2]") or comma-separated text ("1,2") like the list current."""
    text = raw.strip()
    if text.startswith('['):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            raise _bad(key, raw, "a JSON list") from None
        if not isinstance(items, list):
            raise _bad(key, raw, "a JSON list")
    else:
        items = [part.strip() for part in text.split(',')] if text else []
    kinds = {type(x) for x in current}
    if len(kinds) > 1:
        raise UsageError(f"config key {key!r} holds a list of mixed types; cannot override")
    kind = kinds.pop() if kinds else None
    return type(current)(_to_element(key, raw, item, kind) for item in items)


def convert_value(key, raw, current):
    """Parse the override string raw for key into the type of its current value.

    bool: true/false/1/0/yes/no (any case). int: decimal integers only ("0.5", "1e3"
    fail). float: anything float() takes. list: JSON or comma-separated, elements typed
    like the existing ones. A None-valued key takes the string as is.
    """
    if current is None:
        return raw
    if isinstance(current, (list, tuple)):
        return _to_list(key, raw, current)
    for kind in (bool, int, float, str):  # bool first: it is a subclass of int
        if isinstance(current, kind):
            return _to_scalar(key, raw, kind)
    return _to_scalar(key, raw, type(current))  # raises: unsupported type


def apply_overrides(cfg, overrides, words=None):
    """Apply "key=value" strings to cfg in place and return it.

    Each key must exist (the config is flat); the value is converted to the existing value's
    type, or is one of the words `words` ({key: (word, ...)}) allows for that key (e.g.
    sample_ratio=auto). All overrides are checked before any is applied, so on error cfg is
    unchanged. Raises UsageError naming the key, the bad value and the type.
    """
    updates = []
    for text in overrides:
        key, raw = parse_override(text)
        if key not in cfg:
            raise _unknown_key(cfg, key)
        word = raw.strip().lower()
        updates.append((key, word if word in (words or {}).get(key, ()) else convert_value(key, raw, cfg[key])))
    for key, value in updates:
        cfg[key] = value
    return cfg


def save_config(cfg, path):
    """Write cfg as JSON to path atomically (see write_json)."""
    write_json(path, cfg)


def write_json(path, payload):
    """Write payload as JSON (sorted keys, indent 2) to path atomically: a temporary file in
    the same directory, synced, then os.replace. The directory must exist."""
    text = json.dumps(payload, sort_keys=True, indent=2) + '\n'  # fails before touching disk
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
