"""The flags of a server kvbench starts: which it sets itself (a scenario may not), and which make the server act
beyond serving the scenario's model (read or write files, fetch weights or code, run code, reach another machine),
so that kvbench runs them only with ``kvbench run --trust-server-config``."""

from __future__ import annotations

from kvbench.serving import KINDS

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


def _flag_name(arg: str) -> str:
    """A command-line word as the flag it sets: before any ``=`` and any ``.`` (vLLM folds
    ``--kv-transfer-config.kv_connector X`` into ``--kv-transfer-config``'s JSON), underscores as dashes (vLLM
    takes ``--max_num_seqs`` for ``--max-num-seqs``)."""
    name = arg.split("=", 1)[0]
    return name.split(".", 1)[0].replace("_", "-") if name.startswith("--") else name


def _names(arg: str, flags: tuple[str, ...]) -> str | None:
    """The flag of ``flags`` that ``arg`` sets: equal, or a long flag it abbreviates (a prefix of 3 or more
    characters after ``--``); None if none."""
    name = _flag_name(arg)
    if name in flags:
        return name
    if name.startswith("--") and len(name) > 2:
        return next((f for f in flags if f.startswith("--") and f.startswith(name)), None)
    return None


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
    each): a flag of :data:`CONSENT_FLAGS` (or its prefix, for argparse kinds), a flag of the kind's
    :attr:`~kvbench.serving.kind.ServerKind.consent_pattern` (llama.cpp's hub presets), a word
    that holds a "/" (a path the server would read or write, or a URL it would fetch). kvbench runs them only
    with ``--trust-server-config``."""
    flags = CONSENT_FLAGS.get(kind, ())
    known = KINDS.get(kind)
    argparse = known is not None and known.argparse
    pattern = known.consent_pattern if known is not None else None
    out, value = [], False  # value: this word is the value of the flag before it, already named
    for a in args:
        name = _flag_name(a)
        hit = name if name in flags else _names(a, flags) if argparse else None
        if hit is not None:
            out.append(f"{a}: {hit} makes the server read or write files, fetch weights or code, run code or "
                       "reach another machine")
        elif pattern is not None and pattern[0].fullmatch(name):
            out.append(f"{a}: {pattern[1]}")
        elif "/" in a and not value:
            out.append(f"{a!r}: names a path or a URL the server would read, write or fetch")
        value = hit is not None and "=" not in a
    return out
