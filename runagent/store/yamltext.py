"""YAML as run-agent's own files use it, without paying for PyYAML where it is not needed.

Importing PyYAML costs a command about as much as the rest of its start-up (its pure-Python
loader and dumper are imported whatever parser is used), while the files a run writes
(run-info.yaml, the lock, task.yaml) are mappings of plain scalars. `dump` writes those itself,
in PyYAML's block style, and hands anything else to PyYAML; `load` always uses PyYAML (libyaml's
parser where it is there), imported on the first read. What `dump` writes reads back through
PyYAML as exactly the data given (tests/store/test_yamltext.py checks it on generated data).
"""

from __future__ import annotations

import math
import re
from typing import Any

# A string written bare: a word that no YAML 1.1 reader takes for anything but a string.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_SPECIAL_WORDS = frozenset(
    ("y", "n", "yes", "no", "on", "off", "true", "false", "null")
)  # compared in lower case: YAML 1.1 reads these as booleans or null
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


class YAMLSyntaxError(ValueError):
    """A text that is not YAML; the message is PyYAML's, the PyYAML error is the cause."""

    def __init__(self, message: str, line: int | None, problem: str | None) -> None:
        super().__init__(message)
        self.line = line  # 1-based, where PyYAML says
        self.problem = problem


def _pyyaml() -> Any:
    import yaml

    return yaml


def load(text: str) -> Any:
    """`yaml.safe_load`, with libyaml where it is there; YAMLSyntaxError if it is not YAML."""
    yaml = _pyyaml()
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise YAMLSyntaxError(str(exc), line, getattr(exc, "problem", None)) from exc


def dump(data: Any, *, sort_keys: bool = True, allow_unicode: bool = False) -> str:
    """`yaml.safe_dump` to a string: written here for a mapping of scalars, nested mappings and
    lists of scalars, else by PyYAML (libyaml's emitter where it is there)."""
    lines: list[str] = []
    if isinstance(data, dict) and data and _block(data, 0, sort_keys, allow_unicode, lines):
        return "\n".join(lines) + "\n"
    yaml = _pyyaml()
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(data, Dumper=dumper, sort_keys=sort_keys, allow_unicode=allow_unicode))


def _block(
    mapping: dict[Any, Any], indent: int, sort_keys: bool, unicode: bool, lines: list[str]
) -> bool:
    """Append `mapping` as a block at `indent`; False if it holds what only PyYAML writes."""
    pad = " " * indent
    keys = list(mapping)
    if sort_keys:
        if not all(isinstance(k, str) for k in keys):
            return False
        keys.sort()
    for key in keys:
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.lower() in _SPECIAL_WORDS:
            return False
        value = mapping[key]
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            if not _block(value, indent + 2, sort_keys, unicode, lines):
                return False
        elif isinstance(value, list) and value:
            lines.append(f"{pad}{key}:")
            for item in value:
                text = _scalar(item, unicode)
                if text is None:
                    return False
                lines.append(f"{pad}- {text}")
        else:
            text = "{}" if value == {} else "[]" if value == [] else _scalar(value, unicode)
            if text is None:
                return False
            lines.append(f"{pad}{key}: {text}")
    return True


def _scalar(value: Any, unicode: bool) -> str | None:
    """One scalar as YAML; None for what is not one of ours (PyYAML then writes the whole)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "." not in text and "e" in text:  # 1e+16: YAML 1.1 reads a float only with a dot
            text = text.replace("e", ".0e", 1)
        return text
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _SPECIAL_WORDS:
            return value
        return _quoted(value, unicode)
    return None


def _quoted(text: str, unicode: bool) -> str:
    """A double-quoted YAML scalar: printable characters as they are (non-ASCII ones only with
    `unicode`), every other one escaped."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0x20 <= code < 0x7F or (unicode and code > 0x7F and _printable(ch)):
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _printable(ch: str) -> bool:
    """Printable as YAML and as Python agree, and no line or byte-order mark of its own."""
    return ch.isprintable() and ch not in "\u2028\u2029\ufeff\u0085" and ch != "\ufffe"
