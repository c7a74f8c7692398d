"""How an agent's stdout lines read: the rules its backend states (`Backend.lines`), which the
page is told (`GET /api/backends/NAME/lines`) and draws the run's stdout by. An agent's event
format is written in its backend and nowhere else: the page knows none.

A line that is a JSON object reads as the parts the first rule it matches gives; a line no rule
matches, or that is no JSON object, is shown as the agent wrote it. A rule is

    {"when": {PATH: VALUE, ...},   the event holds VALUE (a string, a number, true, false or
                                    null) at each PATH,
     "has": [PATH, ...],           and something other than null at each PATH;
     "show": [(KIND, TEXT), ...]}  the line then reads as these parts. In place of "show":
     "each": PATH,                 the list at PATH, each of its elements read by the first of
     "rules": [RULE, ...]          `rules` it matches (an element none matches shows nothing)

A PATH is field names joined by dots (`message.content`). In TEXT, `{PATH}` stands for the value
there: a string as it is, anything else as JSON, nothing as ""; `{A|B}` for the first of A and B
that holds one. KIND is what the part is, one of KINDS (the page gives each its colour).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from runagent.errors import RunAgentError

KINDS = ("assistant", "tool", "error", "result", "meta")
FIELD = r"[A-Za-z0-9_$-]+"  # one field name of a PATH
PLACE = r"\{([^{}]*)\}"  # `{PATH|PATH...}` in a part's text

Scalar = str | int | float | bool | None


class LineRule(TypedDict, total=False):
    when: Mapping[str, Scalar]
    has: Sequence[str]
    show: Sequence[tuple[str, str]]
    each: str
    rules: Sequence[LineRule]


def checked(rules: object, backend: str) -> list[dict[str, Any]]:
    """`rules` as the page is sent them, once each is found well made (what a backend states is
    code of its own, so a fault is the backend's: an error that names it and where)."""
    try:
        return _rules(rules, "lines")
    except _Fault as fault:
        raise RunAgentError(
            f"backend {backend!r} states how its lines read wrongly: {fault}; fix its `lines` "
            "(runagent/loop/lines.py says how they are written)"
        ) from None


class _Fault(Exception):
    pass


def _rules(rules: object, where: str) -> list[dict[str, Any]]:
    if isinstance(rules, str | bytes) or not isinstance(rules, Sequence):
        raise _Fault(f"{where} is {type(rules).__name__}, not a list of rules")
    return [_rule(rule, f"{where}[{i}]") for i, rule in enumerate(rules)]


def _rule(rule: object, where: str) -> dict[str, Any]:
    if not isinstance(rule, Mapping):
        raise _Fault(f"{where} is {type(rule).__name__}, not a rule (a dict)")
    unknown = sorted(set(rule) - {"when", "has", "show", "each", "rules"})
    if unknown:
        raise _Fault(f"{where} has {unknown[0]!r}, which a rule does not take")
    if ("show" in rule) == ("each" in rule) or ("each" in rule) != ("rules" in rule):
        raise _Fault(f"{where} needs either `show`, or `each` with `rules`")
    out: dict[str, Any] = {}
    when = rule.get("when", {})
    if not isinstance(when, Mapping):
        raise _Fault(f"{where}.when is {type(when).__name__}, not a dict of PATH: VALUE")
    for path, value in when.items():
        _path(path, f"{where}.when")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise _Fault(f"{where}.when[{path!r}] is {type(value).__name__}, not a JSON scalar")
    out["when"] = dict(when)
    has = rule.get("has", ())
    if isinstance(has, str) or not isinstance(has, Sequence):
        raise _Fault(f"{where}.has is {type(has).__name__}, not a list of paths")
    out["has"] = [_path(path, f"{where}.has") for path in has]
    if "each" in rule:
        out["each"] = _path(rule["each"], f"{where}.each")
        out["rules"] = _rules(rule["rules"], f"{where}.rules")
        return out
    show = rule["show"]
    if isinstance(show, str) or not isinstance(show, Sequence):
        raise _Fault(f"{where}.show is {type(show).__name__}, not a list of (KIND, TEXT)")
    out["show"] = [_part(part, f"{where}.show[{i}]") for i, part in enumerate(show)]
    return out


def _part(part: object, where: str) -> list[str]:
    if isinstance(part, str) or not isinstance(part, Sequence) or len(part) != 2:
        raise _Fault(f"{where} is not a pair (KIND, TEXT)")
    kind, text = part
    if kind not in KINDS:
        raise _Fault(f"{where}: kind {kind!r} is none of {', '.join(KINDS)}")
    if not isinstance(text, str):
        raise _Fault(f"{where}: the text is {type(text).__name__}, not a string")
    for inside in re.findall(PLACE, text):
        for path in inside.split("|"):
            _path(path, f"{where} {{{inside}}}")
    if re.search(r"[{}]", re.sub(PLACE, "", text)):
        raise _Fault(f"{where}: {text!r} has a brace outside a {{PATH}}")
    return [kind, text]


def _path(path: object, where: str) -> str:
    if not isinstance(path, str) or not all(re.fullmatch(FIELD, f) for f in path.split(".")):
        raise _Fault(f"{where}: {path!r} is not a PATH (field names joined by dots)")
    return path


def read(line: str, rules: Sequence[Mapping[str, Any]]) -> str:
    """`line` in words, as the page draws it (server/static/lines.js, the same rules): the
    parts' texts of the first rule its JSON object matches, joined; the line as it is when it is
    no JSON object or no rule matches; "" when a rule shows nothing of it."""
    import json

    try:
        event = json.loads(line)
    except ValueError:
        return line
    parts = _describe(event, rules) if isinstance(event, dict) else None
    if parts is None:
        return line
    return " ".join(" ".join(text.split()) for _, text in parts if text.strip())


def _at(value: Any, path: str) -> Any:
    for name in path.split("."):
        if not isinstance(value, dict) or name not in value:
            return None
        value = value[name]
    return value


def _fill(text: str, event: Any) -> str:
    def value(found: re.Match[str]) -> str:
        for path in found.group(1).split("|"):
            got = _at(event, path)
            if got is not None:
                import json

                return got if isinstance(got, str) else json.dumps(got)
        return ""

    return re.sub(PLACE, value, text)


def _describe(event: Any, rules: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]] | None:
    for rule in rules:
        when, has = rule.get("when", {}), rule.get("has", ())
        if not all(_at(event, p) == v for p, v in when.items()):
            continue
        if not all(_at(event, p) is not None for p in has):
            continue
        if "show" in rule:
            return [(kind, _fill(text, event)) for kind, text in rule["show"]]
        found = _at(event, rule["each"])
        if found is None:
            return []
        if not isinstance(found, list):
            return None
        return [part for item in found for part in (_describe(item, rule["rules"]) or [])]
    return None
