"""Make the scenario-file reference of the documentation from the pydantic schema: never by hand.

    .venv/bin/python scripts/scenario_reference.py [--check] [--out docs/reference/scenario.md]

Walks :class:`kvbench.scenario.Scenario` and every model inside it, in declaration order, and writes one Markdown
table per model: every key's path, type, default, allowed values and bounds (from ``Literal``, ``Field``
constraints, the value types' validators) and meaning (the field's ``description``); the offload modes come from
the mode registry (:data:`kvbench.offload.modes.MODES`), the server presets from each engine kind's registry.
``--check`` writes nothing: it exits 1, with a diff, when the file differs from what the schema gives.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference" / "scenario.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import annotated_types as at  # noqa: E402
from pydantic import AfterValidator, BaseModel, BeforeValidator, ByteSize  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402

from kvbench.models.locate import presets as model_presets  # noqa: E402
from kvbench.offload.modes import MODES, ModeOptions  # noqa: E402
from kvbench.scenario import bounds, cluster, servers  # noqa: E402
from kvbench.scenario.schema import Scenario  # noqa: E402

COMMAND = "python scripts/scenario_reference.py"


def codes(values: Any) -> str:
    """Values as code spans, comma-separated."""
    return ", ".join(f"`{v}`" for v in values)


#: What a value type's validator allows, in words (a validator not named here adds nothing; ``whole_text``'s
#: checks say it with their own message).
NOTES = {
    bounds._path_text: f"a path, at most {bounds.MAX_PATH:,} characters",
    bounds.check_name: f"letters, digits, `_`, `.`, `-`, starting with a letter, digit or `_`; at most "
                       f"{bounds.MAX_NAME} characters",
    bounds.check_description: f"one line, at most {bounds.MAX_DESCRIPTION} characters",
    bounds.check_size_input: "a number of bytes, or a number and a unit such as `512MiB` or `1.5GB`",
    bounds._bytes_bound: "at most 1 EiB",
    servers._engine_kind: codes(servers.ENGINES),
    servers._url_text: "an `http://` or `https://` URL, e.g. `http://127.0.0.1:8000`",
    servers._flag_text: "at most 4,096 characters, one line",
    servers._no_reserved_flags: "no flag kvbench sets itself (host, port, model...)",
    servers._request_keys: f"at most {servers.MAX_ARGS} options, none of "
                           + codes(sorted(servers.RESERVED_REQUEST_KEYS | servers.SHAPING_REQUEST_KEYS)),
    cluster.check_address: "`auto` or `HOST:PORT`, e.g. `10.0.0.5:6379`",
    cluster.check_label: f"1 to {cluster.MAX_LABEL} letters, digits, `_`, `.`, `-`, starting with a letter, digit "
                         "or `_`",
    cluster._ray_name: f"1 to {cluster.MAX_RAY_NAME} letters, digits, `_`, `.`, `-`, `:`, `/`",
}
#: Allowed values that only a registry knows, by key path.
EXTRA = {
    "model.preset": codes(model_presets()),
    "modes[].preset": "a preset of `engine.kind` (the table under [`modes[]`](#modes))",
}
_BASIC = {int: "integer", float: "number", str: "string", bool: "boolean", ByteSize: "size"}


def markdown(text: str) -> str:
    """Text of the schema as Markdown that shows it as it is: docstring roles (``:class:`x` ``, ````x````) become
    code spans, code spans stay, and everything else that Markdown or HTML would read (``*``, ``_``, ``[``, ``<``,
    ``|``...) is escaped."""
    text = " ".join(text.split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    parts = re.split(r"(`[^`]+`)", text)
    for i in range(0, len(parts), 2):
        p = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        parts[i] = re.sub(r"([\\*_\[\]|#!])", r"\\\1", p)
    return "".join(parts)


def unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """``tp`` without its ``Annotated`` layers, and their metadata (a FieldInfo's own metadata flattened)."""
    meta: list[Any] = []
    while get_origin(tp) is Annotated:
        tp, *more = get_args(tp)
        for m in more:
            meta += m.metadata if isinstance(m, FieldInfo) else [m]
    return tp, meta


def is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def models_in(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a value of type ``tp`` can be (inside unions, lists and mappings), in order."""
    tp, _ = unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for a in get_args(tp) if get_origin(tp) is not Literal else ():
        out += [m for m in models_in(a) if m not in out]
    return out


def is_list(tp: Any) -> bool:
    """A list (or a list, or nothing) of models: its items' keys are written ``key[].item``."""
    tp, _ = unwrap(tp)
    return get_origin(tp) is list or (is_union(tp) and any(is_list(a) for a in get_args(tp)))


def number(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e18 else repr(v)


def limits(tp: Any, meta: list[Any]) -> list[str]:
    """The bounds and validator notes of ``meta`` (for a value of type ``tp``), in words."""
    lo = hi = None
    lo_open = hi_open = False
    n_min = n_max = None
    notes: list[str] = []
    for m in meta:
        if isinstance(m, (at.Ge, at.Gt)):
            lo, lo_open = (m.ge, False) if isinstance(m, at.Ge) else (m.gt, True)
        elif isinstance(m, (at.Le, at.Lt)):
            hi, hi_open = (m.le, False) if isinstance(m, at.Le) else (m.lt, True)
        elif isinstance(m, at.MinLen):
            n_min = m.min_length
        elif isinstance(m, at.MaxLen):
            n_max = m.max_length
        elif isinstance(m, (AfterValidator, BeforeValidator)):
            cells = dict(zip(m.func.__code__.co_freevars, [c.cell_contents for c in m.func.__closure__ or ()]))
            if isinstance(cells.get("message"), str):
                notes.append(markdown(cells["message"].removeprefix("must be ")))
            elif m.func in NOTES:
                notes.append(NOTES[m.func])
    if tp is int:  # whole numbers: > 0 is ≥ 1, < 2^32 is ≤ 2^32 - 1
        lo, lo_open = (lo + 1 if lo is not None and lo_open else lo), False
        hi, hi_open = (hi - 1 if hi is not None and hi_open else hi), False
    out = []
    if lo is not None and hi is not None and not lo_open and not hi_open:
        out.append(f"{number(lo)} to {number(hi)}")
    else:
        if lo is not None:
            out.append(f"more than {number(lo)}" if lo_open else f"at least {number(lo)}")
        if hi is not None:
            out.append(f"less than {number(hi)}" if hi_open else f"at most {number(hi)}")
    unit = "characters" if tp is str else "items"
    if n_min is not None and n_max is not None:
        out.append(f"{n_min} to {n_max} {unit}")
    elif n_min is not None:
        out.append(f"at least {n_min} item{'s' * (n_min != 1)}" if unit == "items" else f"at least {n_min} {unit}")
    elif n_max is not None:
        out.append(f"at most {n_max:,} {unit}")
    return out + notes


def describe(tp: Any, meta: list[Any] = ()) -> tuple[str, str]:
    """``(type, allowed values and bounds)`` of a value of type ``tp`` with field metadata ``meta``, in words."""
    tp, inner = unwrap(tp)
    meta = [*meta, *inner]
    origin = get_origin(tp)
    if origin is Literal:
        values = get_args(tp)
        return _BASIC.get(type(values[0]), "value"), codes(values)
    if is_union(tp):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return describe(args[0], meta)
        kinds, parts = [], []
        for a in args:
            base, _ = unwrap(a)
            if get_origin(base) is Literal:
                kinds.append(codes(get_args(base)))
                continue
            t, lim = describe(a)
            kinds += [t] if t not in kinds else []
            parts += [(t, lim)] if lim else []
        several = len([t for t in kinds if "`" not in t]) > 1  # then say which type each bound is for
        return " or ".join(kinds), "; or ".join(f"{t}: {lim}" if several else lim for t, lim in parts)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "mapping", ""
    if origin is list:
        t, lim = describe(get_args(tp)[0])
        return f"list of {t}", "; ".join(([f"each {lim}"] if lim else []) + limits(list, meta))
    if origin is dict:
        (kt, klim), (vt, vlim) = describe(get_args(tp)[0]), describe(get_args(tp)[1])
        words = [f"keys: {klim}"] * bool(klim) + [f"values: {vlim}"] * bool(vlim) + limits(dict, meta)
        return f"mapping of {kt} to {vt}", "; ".join(words)
    return _BASIC.get(tp, getattr(tp, "__name__", str(tp))), "; ".join(limits(tp, meta))


def default_text(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    value = f.default_factory() if f.default_factory is not None else f.default
    if value is None:
        return "not set"
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    if isinstance(value, ByteSize):
        size = f" ({value // 2**30} GiB)" if value and value % 2**30 == 0 else ""
        return f"`{int(value)}`{size}"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value}`"


@dataclass
class Section:
    """One model's table: its heading (``anchor`` its id), the model's docstring, one row per key."""

    title: str
    anchor: str
    intro: str
    rows: list[list[str]] = field(default_factory=list)
    level: int = 2
    after: str = ""


def anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", path.lower()).strip("-") or "top-level"


def walk(model: type[BaseModel], path: str, title: str, level: int = 2, key: str = "") -> list[Section]:
    """The section of ``model`` (its keys under ``path``) and, after it, those of the models inside it."""
    own = Section(title, key or anchor(path), markdown(model.__doc__ or ""), level=level)
    out = [own]
    for name, f in model.model_fields.items():
        p = f"{path}.{name}" if path else name
        t, allowed = describe(f.annotation, f.metadata)
        inner = models_in(f.annotation)
        item = p + "[]" if is_list(f.annotation) else p
        allowed = "; ".join(filter(None, [allowed, EXTRA.get(p)]))
        if inner:
            allowed = "; ".join(filter(None, [allowed, f"see [`{item}`](#{anchor(item)})"]))
        own.rows.append([f"`{p}`", t, default_text(f), allowed,
                         markdown(f.description or "")])
        if len(inner) == 1:
            out += walk(inner[0], item, f"`{item}`: {inner[0].__name__}", level)
        elif inner:
            out.append(Section(f"`{item}`", anchor(item), markdown(f.description or ""), level=level,
                               after=group_table(inner)))
            for m in inner:
                title, key_ = variant(m, item)
                out += walk(m, item, title, level + 1, key_)
    return out


def variant(model: type[BaseModel], path: str) -> tuple[str, str]:
    """Heading and anchor of one model of a union (an offload mode, a server configuration)."""
    if issubclass(model, ModeOptions):
        kind = get_args(unwrap(model.model_fields["kind"].annotation)[0])[0]
        return f"Offload mode `{kind}`", f"mode-{anchor(kind)}"
    if model is servers.ServerMode:
        return "Server configuration", "server-configuration"
    return model.__name__, anchor(f"{path}-{model.__name__}")


def group_table(models: list[type[BaseModel]]) -> str:
    """The table under a union's heading: for the modes, every offload mode of the registry and every server
    preset of every engine kind."""
    if not any(issubclass(m, ModeOptions) for m in models):
        return ""
    lines = ["For the `transformers` engine each entry is an offload mode, named by `kind` "
             "(`kvbench list modes`):", "", "| `kind` | What stays on the device | Options | Needs CUDA |",
             "| --- | --- | --- | --- |"]
    for kind, info in MODES.items():
        opts = [k for k in info.options.model_fields if k != "kind"]
        lines.append(f"| [`{kind}`](#mode-{anchor(kind)}) | {markdown(info.summary)} | "
                     f"{codes(opts) or 'none'} | {'yes' if info.needs_cuda else 'no'} |")
    lines += ["", "For a server engine (`engine.kind` other than `transformers`) each entry is a server "
              "configuration, named by `name`, that starts from one of its engine's presets:", "",
              "| `engine.kind` | `preset` | Meaning | `size` (unit, default) | Needs a GPU |",
              "| --- | --- | --- | --- | --- |"]
    for kind, registry in servers.PRESETS.items():
        for name, p in registry.items():
            size = f"{markdown(p.size[0])}, `{p.size[1]:g}`" if p.size else "none"
            lines.append(f"| `{kind}` | `{name}` | {markdown(p.meaning)} | {size} | {'yes' if p.needs_gpu else 'no'} |")
    return "\n".join(lines)


def sections() -> list[Section]:
    """Every section of the reference, the top level first, then each model in the order its key is declared."""
    return walk(Scenario, "", "Top level", key="top-level")


def keys(parts: list[Section] | None = None) -> list[str]:
    """The key paths of every row, in order (a path can repeat: ``modes[].kind`` in every mode)."""
    return [row[0].strip("`") for s in parts or sections() for row in s.rows]


def render() -> str:
    """The whole reference page, as Markdown."""
    parts = sections()
    out = ["# Scenario keys", "",
           f"<!-- Generated by `{COMMAND}` from the scenario schema (kvbench/scenario). Do not edit by hand. -->", "",
           "Every key a scenario file can hold, from the pydantic models that `kvbench validate` and `kvbench run` "
           f"check it against. This page is generated by `{COMMAND}`: do not edit it by hand; change the schema "
           "(a field's `description=`) and run the script again.", "",
           "A key path joins keys with `.`; `[]` is an entry of a list (`modes[].kind` is the `kind` of each entry "
           "of `modes:`). Unknown keys are errors. A default of “not set” means the key may be left out. Checks "
           "that involve several keys (for example exactly one of `model.name`, `model.preset`, `model.config`) are "
           "given in the meanings and in `kvbench validate`'s messages.", "",
           f"{len(set(keys(parts)))} keys in {len(parts)} sections:", ""]
    out += [f"{'    ' * (s.level - 2)}- [{s.title}](#{s.anchor})" for s in parts]
    for s in parts:
        out += ["", f"{'#' * s.level} {s.title} {{#{s.anchor}}}", ""]
        if s.intro:
            out += [s.intro, ""]
        if s.after:
            out += [s.after, ""]
        if s.rows:
            out += ["| Key | Type | Default | Allowed | Meaning |", "| --- | --- | --- | --- | --- |"]
            out += ["| " + " | ".join(c or " " for c in row) + " |" for row in s.rows]
        while out[-1] == "":
            out.pop()
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help="the page to write (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        if old == text:
            return 0
        diff = difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(args.out), "schema")
        sys.stdout.writelines(diff)
        print(f"{args.out} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"{args.out}: {len(set(keys()))} keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
