"""How a scenario's validation error is worded: the key path (``modes[1].window``), the bad value (cut to
:data:`MAX_ECHO` characters) and what is allowed, from pydantic's errors."""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from kvbench.offload.modes import MODES
from kvbench.scenario.schema import OFFLOAD_TAG, SERVER_TAG, Scenario
from kvbench.scenario.servers import ServerMode

#: Longest echo of a bad value in an error message (characters).
MAX_ECHO = 80

_MODE_CLASSES = {kind: m.options for kind, m in MODES.items()}


def problems(exc: ValidationError) -> list[tuple[str, str]]:
    """pydantic's errors of :class:`~kvbench.scenario.schema.Scenario` as ``(key path, message)`` pairs, one per
    fault, each message naming the bad value and what is allowed."""
    return [_keyed(_path(e["loc"]), _describe(e)) for e in _one_or_many(_auto_union(exc.errors()))]


def echo(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_ECHO` characters (an integer past Python's 4,300-digit limit of
    ``repr`` is described by its size)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<an integer of about {int(value.bit_length() * 0.30103):,} digits>"
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}… ({len(text):,} characters)"


def _path(loc: tuple[Any, ...]) -> str:
    """pydantic's loc → ``modes[1].window`` (dropping the discriminator tag pydantic inserts)."""
    out = ""
    prev: Any = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(prev, int) and part in (OFFLOAD_TAG, SERVER_TAG):
            continue  # the union tag of offload modes and server configurations (prev stays the index)
        elif isinstance(prev, int) and part in _MODE_CLASSES:
            pass  # the union tag
        else:
            out += f".{part}" if out else str(part)
        prev = part
    return out


def _unwrap(tp: Any) -> list[Any]:
    """The model classes inside an annotation (through Optional, list, Annotated and unions)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType, list):
        return [c for a in typing.get_args(tp) for c in _unwrap(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class a loc points into (for listing allowed keys)."""
    candidates: list[Any] = [Scenario]
    for part in loc:
        if isinstance(part, int):
            continue
        if part == SERVER_TAG and ServerMode in candidates:
            candidates = [ServerMode]
            continue
        if part == OFFLOAD_TAG:
            continue
        if part in _MODE_CLASSES and any(c in _MODE_CLASSES.values() for c in candidates):
            candidates = [_MODE_CLASSES[part]]
            continue
        nxt = [c for c in candidates if part in c.model_fields]
        if not nxt:
            return None
        candidates = _unwrap(nxt[0].model_fields[part].annotation)
    return candidates[0] if len(candidates) == 1 else None


def _describe(err: dict[str, Any]) -> str:
    """One pydantic error as a sentence: the fault, the bad value (echoed) and what is allowed."""
    typ, msg, value = err["type"], err["msg"], err.get("input")
    if typ == "extra_forbidden":
        cls = _model_at(err["loc"][:-1])
        key = str(err["loc"][-1])
        close = difflib.get_close_matches(key, list(cls.model_fields), n=1) if cls else []
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown key '{key}'; {hint}allowed keys: {', '.join(cls.model_fields) if cls else '?'}"
    if typ == "union_tag_invalid":
        return MODES.unknown(str(err["ctx"]["tag"]))
    if typ == "union_tag_not_found":
        return (f"each mode needs a `kind` (an offload mode: {', '.join(MODES.names())}) or, for a server engine, "
                "a `name` (a server configuration)")
    if typ == "missing":
        return "required key is missing"
    if typ in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping of keys (got {echo(value)})"
    if typ == "byte_size" or typ.startswith("byte_size"):
        return f"{msg} (got {echo(value)}); give bytes or a size such as 2GiB, 512MiB, 1.5GB"
    msg = msg.removeprefix("Value error, ")
    if typ == "literal_error":
        return f"got {echo(value)}; {msg[0].lower()}{msg[1:]}"
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict) for v in value)):
        return msg  # a whole mapping or list of mappings is too long to echo
    return f"{msg} (got {echo(value)})"


_LIST_TAG, _AUTO_TAG, _INT_TAG = "list[constrained-int]", "literal['auto']", "constrained-int"


def _auto_union(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors of a ``list | "auto"`` field (prompt_tokens, batch_sizes) as one per fault: pydantic reports each
    branch of the union; keep the list branch's (its tag dropped from the path), or for a value that is neither
    a list nor 'auto' a single message saying both."""
    out = []
    for e in errors:
        loc = e["loc"]
        if len(loc) >= 2 and loc[1] == _AUTO_TAG:
            continue
        if len(loc) >= 2 and loc[1] == _LIST_TAG:
            e = {**e, "loc": (loc[0], *loc[2:])}
            if e["type"] == "list_type":
                e = {**e, "type": "value_error", "msg": "must be a list of positive integers or auto"}
        out.append(e)
    return out


def _one_or_many(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Errors of a nested ``int | list[int]`` field (``load.concurrency``) as one per fault: pydantic reports each
    branch (tags ``constrained-int`` and ``list[constrained-int]``); keep the branch that fits the value's shape
    (a list: the list's; anything else: the number's), and for a value that is neither one message saying both."""
    out, seen = [], set()
    for e in errors:
        loc = e["loc"]
        tag = next((i for i, part in enumerate(loc) if i >= 2 and part in (_INT_TAG, _LIST_TAG)), None)
        if tag is None:
            out.append(e)
            continue
        is_list = isinstance(e.get("input"), list) if loc[tag] == _INT_TAG else None
        key = loc[:tag]
        if loc[tag] == _INT_TAG and e["type"] == "int_type" and is_list:
            continue  # a list given: the number branch's complaint is noise
        if loc[tag] == _LIST_TAG and e["type"] == "list_type":
            if any(x["loc"][:tag + 1] == (*key, _INT_TAG) and x["type"] == "int_type" for x in errors):
                if key not in seen:  # neither a number nor a list
                    seen.add(key)
                    out.append({**e, "loc": key, "type": "value_error",
                                "msg": "must be a whole number or a list of whole numbers"})
            continue  # a number given: the list branch's complaint is noise
        if loc[tag] == _INT_TAG and e["type"] == "int_type":
            continue  # neither: said once above
        out.append({**e, "loc": (*key, *loc[tag + 1:])})
    return out


#: Sections whose own checks name one of their keys first (``rate: required ...``).
_SECTIONS = ("engine", "load", "executor")


def _keyed(path: str, msg: str) -> tuple[str, str]:
    """A whole-scenario check names its key at the start of its message (``capacity: ...``): make it the path."""
    m = re.match(r"([a-z_]+): (.*)", msg, flags=re.S)
    if path in _SECTIONS and m:  # a section's own check names its key: load: rate: ... is load.rate
        model = next(iter(_unwrap(Scenario.model_fields[path].annotation)), None)
        if model is not None and m.group(1) in model.model_fields:
            return f"{path}.{m.group(1)}", m.group(2)
    if not path and m and m.group(1) in Scenario.model_fields:
        key, rest = m.group(1), m.group(2)
        if (item := re.match(r"\[(\d+)\] (.*)", rest, flags=re.S)):  # one entry of a list: modes[1]
            if (flags := re.match(r"args: (.*)", item.group(2), flags=re.S)):  # its server flags: modes[1].args
                return f"{key}[{item.group(1)}].args", flags.group(1)
            return f"{key}[{item.group(1)}]", item.group(2)
        return key, rest
    return path, msg
