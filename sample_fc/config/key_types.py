"""Declared config types and `key=value` overrides.

Nothing here knows which keys a config has: keys.py declares each key with one of the
types below (its default, range and allowed words), and every reader of a value converts and
checks through that declaration: presets (`accept`), `--set key=value` text (`parse`), a
saved run's config (`accept` of its JSON values). A value that does not fit is a UsageError
naming the key, the bad value and what the key takes.

    table = KeyTable()
    table.lr = Real(0.1, lo=0, lo_open=True)                             # the learning rate
    table.lr_steps = ListOf([100, 200], Int(1, lo=1), increasing=True)   # when it drops
    keys = vars(table)
    cfg = apply_overrides(defaults(keys), ['lr=0.2', 'lr_steps=100,200'], keys)
"""
import difflib
import json
import math

from easydict import EasyDict

from ..errors import UsageError

FLOAT32_TINY = 1.1754943508222875e-38    # float32's smallest normal: MXNet takes its attributes as float32
_TRUE = ('true', '1', 'yes')
_FALSE = ('false', '0', 'no')


def _fail(key, value, expected):
    return UsageError(f"config key {key!r} is {value!r}; expected {expected}")


class _Refused(Exception):
    """A value a key's type does not take; its argument says what the key takes."""


def _interval(lo, hi, lo_open=False, hi_open=False, fmt=repr):
    """'>= 1', '> 0', 'in [0, 1)' ...: the range part of a description."""
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {fmt(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {fmt(hi)}"
    return ""


class KeyType:
    """A config key's declared type: its default, what it takes, and how text converts to it.

    accept(key, value): the value (a preset's, a saved config's JSON value) checked and in the
    declared type, else UsageError naming the key and the value. parse(key, text): the same
    from `--set key=text`, the error naming the text as typed. A type's `words` (e.g. 'auto')
    are taken besides its values.
    """
    words = ()

    def __init__(self, default):
        self.default = default

    def describe(self):
        raise NotImplementedError

    def expected(self):
        return self.describe() + "".join(f" or {word}" for word in self.words)

    def accept(self, key, value):
        try:
            return self.take(value)
        except _Refused as refused:
            raise _fail(key, value, refused.args[0]) from None

    def parse(self, key, text):
        try:
            return self.take_text(text)
        except _Refused as refused:
            raise _fail(key, text, refused.args[0]) from None

    def take(self, value):
        """The value in this type, or _Refused."""
        if isinstance(value, str) and value in self.words:
            return value
        return self._take(value)

    def take_text(self, text):
        """The value `text` stands for, in this type, or _Refused."""
        word = text.strip().lower()
        return word if word in self.words else self.take(self._from_text(text))

    def _refuse(self):
        raise _Refused(self.expected())

    def _from_text(self, text):
        return text

    def _take(self, value):
        raise NotImplementedError


class Flag(KeyType):
    """True or False; text true/false, 1/0, yes/no in any case."""

    def describe(self):
        return "true or false (also 1/0, yes/no)"

    def _from_text(self, text):
        word = text.strip().lower()
        if word not in _TRUE + _FALSE:
            self._refuse()
        return word in _TRUE

    def _take(self, value):
        if not isinstance(value, bool):
            self._refuse()
        return value


class Int(KeyType):
    """An integer in [lo, hi] (hi inclusive), a multiple of `multiple` when given; text in
    decimal digits only ('0.5' and '1e3' are not integers). With `share`, also a share of the
    run written 'N%' (0 <= N < 100), kept as that text; steps_of resolves it."""

    def __init__(self, default, lo=None, hi=None, multiple=None, words=(), share=False):
        super().__init__(default)
        self.lo, self.hi, self.multiple, self.words, self.share = lo, hi, multiple, tuple(words), share

    def describe(self):
        kind = f"a multiple of {self.multiple}" if self.multiple else "an integer"
        share = ", or a share of max_update as N% (0 <= N < 100)" if self.share else ""
        return f"{kind} {_interval(self.lo, self.hi)}".strip() + share

    def _from_text(self, text):
        if self.share and text.strip().endswith('%'):
            return text.strip()
        try:
            return int(text.strip())
        except ValueError:              # also text of more digits than int() converts
            self._refuse()

    def _take(self, value):
        if self.share and isinstance(value, str) and value.endswith('%'):
            try:
                percent = float(value[:-1])
            except ValueError:
                self._refuse()
            if not 0 <= percent < 100:
                self._refuse()
            return f"{percent:g}%"
        if (not isinstance(value, int) or isinstance(value, bool)
                or (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi)
                or (self.multiple and value % self.multiple)):
            self._refuse()
        return int(value)


class Real(KeyType):
    """A finite float in a range (each end open or closed); an integer is taken as its float. A
    nonzero value smaller than float32's smallest normal is refused: MXNet reads operator and
    optimizer attributes as float32 and fails on it ("Out of range value for p")."""

    def __init__(self, default, lo=None, hi=None, lo_open=False, hi_open=False, words=()):
        super().__init__(default)
        self.lo, self.hi, self.lo_open, self.hi_open, self.words = lo, hi, lo_open, hi_open, tuple(words)

    def describe(self):
        return f"a finite number {_interval(self.lo, self.hi, self.lo_open, self.hi_open, fmt='{:g}'.format)}".strip()

    def _from_text(self, text):
        try:
            return float(text.strip())
        except ValueError:
            self._refuse()

    def _take(self, value):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self._refuse()
        try:
            number = float(value)
        except OverflowError:           # an integer beyond float's range
            self._refuse()
        if (not math.isfinite(number)
                or (self.lo is not None and (number <= self.lo if self.lo_open else number < self.lo))
                or (self.hi is not None and (number >= self.hi if self.hi_open else number > self.hi))):
            self._refuse()
        if 0 < abs(number) < FLOAT32_TINY:
            raise _Refused(f"{self.expected()}, and 0 or at least {FLOAT32_TINY:.2g} in size (float32's smallest)")
        return number


class Text(KeyType):
    """A string without NUL characters (they cannot be in a path or an argument)."""

    def describe(self):
        return "a string"

    def _take(self, value):
        if not isinstance(value, str) or '\x00' in value:
            self._refuse()
        return value


class Choice(KeyType):
    """One of a fixed set of words; text is taken without surrounding spaces."""

    def __init__(self, default, choices):
        super().__init__(default)
        self.choices = tuple(choices)

    def describe(self):
        return f"one of: {', '.join(self.choices)}"

    def _from_text(self, text):
        return text.strip()

    def _take(self, value):
        if not isinstance(value, str) or value not in self.choices:
            self._refuse()
        return value


class ListOf(KeyType):
    """A list of `item` values: JSON ("[1, 2]") or comma-separated text ("1, 2"; "" is the
    empty list); `increasing`: strictly increasing; `check(element)` raises ValueError for an
    element the item type takes but the key does not (e.g. an unknown signal name)."""

    def __init__(self, default, item, increasing=False, check=None):
        super().__init__(default)
        self.item, self.increasing, self.check = item, increasing, check

    def describe(self):
        order = ", strictly increasing" if self.increasing else ""
        return f"a list (JSON [a, b] or a,b), each {self.item.describe()}{order}"

    def _from_text(self, text):
        stripped = text.strip()
        if stripped.startswith('['):
            try:
                return json.loads(stripped)
            except (ValueError, RecursionError):
                inner = stripped[1:-1]          # [a, b]: what bash leaves of ["a", "b"] typed unquoted
                if not stripped.endswith(']') or '[' in inner or ']' in inner:
                    self._refuse()
                stripped = inner.strip()
        return [self._element_text(part.strip()) for part in stripped.split(',')] if stripped else []

    def _element_text(self, text):
        try:
            return self.item.take_text(text)
        except _Refused:
            self._refuse()

    def _take(self, value):
        if not isinstance(value, (list, tuple)):
            self._refuse()
        try:
            items = [self.item.take(element) for element in value]
        except _Refused:
            self._refuse()
        if self.increasing and any(a >= b for a, b in zip(items, items[1:])):
            self._refuse()
        for element in items:
            try:
                self.check and self.check(element)
            except ValueError as err:
                raise _Refused(f"{self.expected()} ({err})") from None
        return items


class KeyTable:
    """Collects `table.name = KeyType(...)` declarations in order: `vars(table)` is {name: type}."""


def defaults(keys):
    """A config (EasyDict) of every declared key's default (fresh copies)."""
    return EasyDict({name: json.loads(json.dumps(kind.default)) for name, kind in keys.items()})


def parse_override(text):
    """Split "key=value" at the first '=' into (key, raw_value); the value may be empty.

    Raises UsageError naming the text when there is no '=' or the key is empty.
    """
    key, sep, raw = text.partition('=')
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"malformed override {text!r}: expected key=value")
    return key, raw


def _unknown_key(keys, key):
    close = difflib.get_close_matches(key, list(keys), n=1)
    if close:
        return UsageError(f"unknown config key {key!r}; did you mean {close[0]!r}?")
    return UsageError(f"unknown config key {key!r}; valid keys: {', '.join(keys)}")


def apply_overrides(cfg, overrides, keys):
    """Apply "key=value" strings to cfg in place and return it.

    Each key must be declared in `keys` ({name: KeyType}); its text is converted and checked
    by the key's type (KeyType.parse). All overrides are checked before any is applied, so on
    error cfg is unchanged. Raises UsageError naming the key, the bad value and what it takes.
    """
    updates = []
    for text in overrides:
        key, raw = parse_override(text)
        if key not in keys:
            raise _unknown_key(keys, key)
        updates.append((key, keys[key].parse(key, raw)))
    for key, value in updates:
        cfg[key] = value
    return cfg
