"""The flags of a server kvbench starts: which it sets itself (a scenario may not), and which make the server act
beyond serving the scenario's model (read or write files, fetch weights or code, run code, reach another machine),
so that kvbench runs them only with ``kvbench run --trust-server-config``."""

from __future__ import annotations

from kvbench.serving import KINDS
from kvbench.serving.kind import CodeFlag

#: Flags kvbench sets on every server it starts: where it listens (127.0.0.1 at a free port, never another
#: interface), and per kind what it loads, its slots, context, seed and metrics
#: (:attr:`~kvbench.serving.kind.ServerKind.reserved_flags`). A flag that names one of these, or a prefix of one
#: (argparse, which vLLM and SGLang parse with, takes ``--hos`` for ``--host``), is refused.
RESERVED_FLAGS: dict[str, tuple[str, ...]] = {
    "": ("--host", "--port"),
    **{k.name: k.reserved_flags for k in KINDS.values() if k.started},
}
#: Server flags that make a server read or write files, fetch weights or code, run code, or send data elsewhere
#: (:attr:`~kvbench.serving.kind.ServerKind.consent_flags`): kvbench runs a scenario that gives one (in
#: ``engine.args`` or a mode's ``args``) only with ``--trust-server-config``; so is any flag or value that holds a
#: "/" (a path or a URL).
CONSENT_FLAGS: dict[str, tuple[str, ...]] = {k.name: k.consent_flags for k in KINDS.values() if k.started}
#: Server flags that make a server import, load or evaluate code
#: (:attr:`~kvbench.serving.kind.ServerKind.code_flags`), by each spelling the parser declares: kvbench runs a
#: scenario that gives one only with ``--trust-server-config``, and its refusal says what the flag loads.
CODE_FLAGS: dict[str, dict[str, CodeFlag]] = {
    k.name: {name: c for c in k.code_flags for name in c.flags} for k in KINDS.values() if k.started}


def _flag_name(arg: str) -> str:
    """A command-line word as the flag it sets: before any ``=`` and any ``.`` (vLLM folds
    ``--kv-transfer-config.kv_connector X`` and ``-cc.mode=3`` into the flag's JSON), underscores as dashes in a
    long flag (vLLM takes ``--max_num_seqs`` for ``--max-num-seqs``)."""
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        return name.split(".", 1)[0].replace("_", "-")
    return name.split(".", 1)[0] if name.startswith("-") and len(name) > 2 else name


def _names(arg: str, flags: tuple[str, ...]) -> str | None:
    """The flag of ``flags`` that ``arg`` sets: equal, or a long flag it abbreviates (a prefix of 3 or more
    characters after ``--``); None if none."""
    name = _flag_name(arg)
    if name in flags:
        return name
    if name.startswith("--") and len(name) > 2:
        return next((f for f in flags if f.startswith("--") and f.startswith(name)), None)
    return None


def _code_flag(kind: str, args: list[str], i: int) -> tuple[str, CodeFlag] | None:
    """The spelling and :class:`~kvbench.serving.kind.CodeFlag` of ``kind`` that ``args[i]`` gives, or None: the
    flag itself (``--a-b``, ``--a_b``, ``--a-b=v``, dotted ``--a-b.key``, ``-x.key=v``), for an argparse kind a
    prefix argparse takes for it (``--a``; ``-c`` for ``-cc``), and a one-letter flag with its value joined
    (``-O.level=3``, ``-O{...}``); none where the value is one of the flag's ``safe`` ones (``-O3``, ``-O 3``)."""
    flags, arg = CODE_FLAGS.get(kind, {}), args[i]
    if not flags or not arg.startswith("-"):
        return None
    name = _flag_name(arg)
    hit = name if name in flags else None
    if hit is None and KINDS[kind].argparse and len(name) > 1:
        dashes = "--" if name.startswith("--") else "-"
        hit = next((f for f in flags if f.startswith(dashes) and f[len(dashes)] != "-" and f.startswith(name)), None)
    value = arg.split("=", 1)[1] if hit is not None and "=" in arg and "." not in arg.split("=", 1)[0] else None
    if hit is None and not arg.startswith("--") and arg[:2] in flags:  # -O3, -O=3, -O.level=3
        hit, value = arg[:2], arg[2:].removeprefix("=")
    if hit is None:
        return None
    if flags[hit].safe:
        given = value if value is not None else (args[i + 1] if i + 1 < len(args) and arg == hit else None)
        if given in flags[hit].safe:
            return None
    return hit, flags[hit]


def reserved_flag_problems(kind: str, args: list[str]) -> list[str]:
    """Why kvbench refuses words of ``args`` for a ``kind`` server (one message each): a flag kvbench sets itself
    (:data:`RESERVED_FLAGS`, or a prefix of one), a bare ``--`` (after it the flags kvbench puts last would be
    taken as positional words)."""
    reserved = RESERVED_FLAGS[""] + (RESERVED_FLAGS.get(kind, ()) if kind else ())
    out = []
    for a in args:
        if a == "--":
            out.append("--: would end the server's options, and kvbench's own flags come after it")
        elif (hit := _names(a, reserved)) is not None:
            what = f"{a} (a prefix of {hit}, which argparse takes for it)" if _flag_name(a) != hit else a
            why = ("a server it starts listens on 127.0.0.1 at a free port, never another interface"
                   if hit in RESERVED_FLAGS[""] else "it loads the scenario's model with its own slots, context, "
                   f"seed and metrics{KINDS[kind].reserved_why if kind in KINDS else ''}")
            out.append(f"{what}: kvbench sets this itself: {why} (kvbench's: {', '.join(reserved)})")
    return out


def consent_reasons(kind: str, args: list[str]) -> list[str]:
    """The words of ``args`` that a ``kind`` server would act on beyond serving the scenario's model (one reason
    each): a flag of :data:`CODE_FLAGS` in any spelling its parser takes (:func:`_code_flag`), saying what code it
    loads, a flag of :data:`CONSENT_FLAGS` (or its prefix, for argparse kinds), a flag of the kind's
    :attr:`~kvbench.serving.kind.ServerKind.consent_pattern` (llama.cpp's hub presets), a word
    that holds a "/" (a path the server would read or write, or a URL it would fetch). kvbench runs them only
    with ``--trust-server-config``."""
    flags = CONSENT_FLAGS.get(kind, ())
    known = KINDS.get(kind)
    argparse = known is not None and known.argparse
    pattern = known.consent_pattern if known is not None else None
    out, value = [], False  # value: this word is the value of the flag before it, already named
    for i, a in enumerate(args):
        name = _flag_name(a)
        code = _code_flag(kind, args, i) if not value else None
        hit = code[0] if code else name if name in flags else _names(a, flags) if argparse else None
        if code is not None:
            out.append(f"{a}: {code[0]} makes the server run code ({code[1].loads})")
        elif hit is not None:
            out.append(f"{a}: {hit} makes the server read or write files, fetch weights or code, run code or "
                       "reach another machine")
        elif pattern is not None and pattern[0].fullmatch(name):
            out.append(f"{a}: {pattern[1]}")
        elif "/" in a and not value:
            out.append(f"{a!r}: names a path or a URL the server would read, write or fetch")
        value = hit is not None and "=" not in a
    return out
