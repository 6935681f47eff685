"""Serving engines in a scenario: the ``engine:`` key, the ``load:`` key, and the modes of a server run (server
configurations), with the named presets shipped per engine.

For ``engine.kind: transformers`` (the default) the modes are kvbench's own offload modes
(:data:`kvbench.offload.modes.MODES`). For a server kind each ``modes:`` entry is a server configuration: a
``name``, the ``preset`` it starts from (default: its name), extra server flags (``args``) and per-request options
(``request``). A preset is what people would otherwise have to know of the engine's flags (:data:`PRESETS`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import urllib.parse
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictBool, model_validator

from kvbench.offload.registry import Registry
from kvbench.scenario.bounds import PathText, Strict, check_name, number, optional
from kvbench.scenario.server_flags import reserved_flag_problems
from kvbench.serving import KINDS
from kvbench.serving.kind import Preset

#: The engines a scenario can name (with did-you-mean): the in-process one and every server kind
#: (:data:`kvbench.serving.KINDS`), reached over HTTP.
ENGINES: Registry[str] = Registry("engine", [
    ("transformers", "in-process: kvbench's own offload caches on Hugging Face transformers"),
    *((k.name, k.meaning) for k in KINDS.values()),
])
#: The server kinds kvbench starts itself (the others are already running at ``url``).
STARTED_KINDS = tuple(k.name for k in KINDS.values() if k.started)
#: The presets per server kind, with did-you-mean for a wrong name.
PRESETS: dict[str, Registry[Preset]] = {k.name: k.presets for k in KINDS.values()}
#: The server kinds as a message names them ("a, b, c or d").
SERVER_KINDS_TEXT = ", ".join(list(KINDS)[:-1]) + f" or {list(KINDS)[-1]}"
#: The kinds already running (kvbench starts nothing), as a message names them.
RUNNING_KINDS_TEXT = " or ".join(k for k in KINDS if k not in STARTED_KINDS)

#: Longest wait for a server's /health, and for one request's reply (seconds).
MAX_TIMEOUT_S = 3600.0
#: Server flags and request options per mode or engine.
MAX_ARGS = 200
#: Request keys kvbench sets itself on every request (the prompt, the length, streaming): a mode cannot change them.
RESERVED_REQUEST_KEYS = frozenset({"prompt", "n_predict", "max_tokens", "stream", "stream_options", "model",
                                   "return_tokens", "ignore_eos", "temperature", "seed", "top_k", "n_probs"})
#: Request keys that would change what a reply is (its length, its number of choices, the prompt echoed in it) or
#: which server slot it takes (kvbench's, for disk-slots): a mode cannot set them either.
SHAPING_REQUEST_KEYS = frozenset({"id_slot", "t_max_predict_ms", "t_max_prompt_ms", "stop", "n", "best_of", "echo",
                                  "min_tokens", "max_completion_tokens", "n_cmpl", "n_discard", "n_keep"})


def _flag_text(v: str) -> str:
    if "\0" in v or "\n" in v:
        raise ValueError("a server flag cannot hold a NUL byte or a line break")
    if len(v) > 4096:
        raise ValueError("a server flag has at most 4096 characters")
    return v


def _no_reserved_flags(v: list[str]) -> list[str]:
    bad = reserved_flag_problems("", v)
    if bad:
        raise ValueError(bad[0])
    return v


Flags = Annotated[list[Annotated[str, AfterValidator(_flag_text)]], Field(max_length=MAX_ARGS),
                  AfterValidator(_no_reserved_flags)]
Scalar = (Annotated[bool, Field(strict=True)] | Annotated[int, Field(strict=True)]
          | Annotated[float, Field(strict=True, allow_inf_nan=False)] | Annotated[str, Field(max_length=4096)])
Seconds = number(0, MAX_TIMEOUT_S, above=True)


def _request_keys(v: dict[str, Any]) -> dict[str, Any]:
    bad = sorted(set(v) & RESERVED_REQUEST_KEYS)
    if bad:
        raise ValueError(f"{', '.join(bad)}: kvbench sets {'this' if len(bad) == 1 else 'these'} on every request "
                         f"(reserved: {', '.join(sorted(RESERVED_REQUEST_KEYS))})")
    shaping = sorted(set(v) & SHAPING_REQUEST_KEYS)
    if shaping:
        raise ValueError(f"{', '.join(shaping)}: would change a reply's length or choices, or the slot it takes; "
                         "kvbench asks every mode for the same tokens, on the slots it assigns (refused: "
                         f"{', '.join(sorted(SHAPING_REQUEST_KEYS))})")
    if len(v) > MAX_ARGS:
        raise ValueError(f"at most {MAX_ARGS} request options")
    return v


_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?(/[\w\-./]*)?")


def _url_text(v: str) -> str:
    if not _URL.fullmatch(v):
        raise ValueError("must be an http:// or https:// URL such as http://127.0.0.1:8000 (no query, no spaces)")
    return v.rstrip("/")


def _openai_url(url: str) -> None:
    """Refuse an ``openai`` base URL that ends in ``/v1`` (kvbench adds ``/v1/completions``) or names a port
    outside 1..65535."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        why = "the port must be 1 to 65535" if "port" in str(exc).lower() else "the host is no name or address"
        raise ValueError(f"url: {url}: {why}") from None
    if not host:
        raise ValueError(f"url: {url}: no host (give one, e.g. http://127.0.0.1:8000)")
    if port == 0:
        raise ValueError(f"url: {url}: the port must be 1 to 65535")
    if parts.path.rstrip("/").endswith("/v1"):
        base = url[: url.rstrip("/").rindex("/v1")]
        raise ValueError(f"url: {url} ends in /v1: give the server's base URL ({base}); kvbench adds "
                         "/v1/completions, /v1/models and /metrics itself")


def loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine: ``localhost``, 127.0.0.0/8 (also as ``127.1`` or IPv4-mapped
    ``::ffff:127.0.0.1``), ``::1``, or the unspecified 0.0.0.0 / ``::`` (which a connection takes for this one)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:  # the shorthand IPv4 forms inet_aton takes (127.1)
            ip = ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_unspecified


class ServerMode(Strict):
    """A server configuration of a server run (``engine.kind`` other than transformers)."""

    name: Annotated[str, AfterValidator(check_name)] = Field(
        description="The mode's name in results and reports; a preset's name uses that preset.")
    preset: str | None = optional("The engine's preset this configuration starts from (default: `name`; see "
                                  "`kvbench list modes`).")
    args: Flags = Field(default_factory=list, description="Extra server flags for this mode, after the preset's.")
    request: Annotated[dict[str, Scalar], AfterValidator(_request_keys)] = Field(
        default_factory=dict, description="Options sent with every request, over the preset's (e.g. "
        "cache_prompt: false); the prompt, length and sampling keys are kvbench's.")
    size: number(0, 2**20, above=True) | None = optional(
        "The preset's size: llama.cpp host-cache --cache-ram MiB (default 1024), vLLM cpu-offload "
        "--kv-offloading-size GiB (default 8), SGLang hicache --hicache-ratio (default 2).")
    url: Annotated[str, AfterValidator(_url_text)] | None = optional(
        "openai: the base URL of the running server this mode measures, where it is not engine.url (e.g. the "
        "same deployment with its host tier on, for the tier preset).")

    @property
    def kind(self) -> str:
        """The preset's name (``none`` is the reference every request's output is compared with)."""
        return self.preset or self.name

    @property
    def label(self) -> str:
        """The mode's name."""
        return self.name

    @property
    def options(self) -> dict[str, Any]:
        """What the scenario gave beyond the preset: ``args``, ``request``, ``size``, ``url`` (for the row)."""
        return {k: v for k, v in (("args", self.args), ("request", self.request), ("size", self.size),
                                  ("url", self.url)) if v}


def _engine_kind(v: str) -> str:
    if v not in ENGINES:
        raise ValueError(ENGINES.unknown(v))
    return v


class EngineSpec(Strict):
    """What runs the trials: kvbench's in-process transformers engine, or a server over HTTP."""

    kind: Annotated[str, AfterValidator(_engine_kind)] = Field(
        "transformers", description="transformers (in-process, kvbench's offload modes) | llama.cpp | vllm | sglang "
        "(kvbench starts the server per mode on 127.0.0.1) | openai (a server already running at url).")
    binary: PathText | None = optional("The server program (default: llama-server in kvbench's environment or on "
        "PATH; vllm: the Python of .venv/vllm that `make vllm` installs, else vllm; sglang: a Python with the "
        "sglang package).")
    python: PathText | None = optional("vllm, sglang: a Python interpreter with the engine's package; kvbench runs "
        "its server module (python -m vllm.entrypoints.openai.api_server, python -m sglang.launch_server).")
    model: PathText | None = optional("What the server loads (default: the scenario's model; the alias "
        "smollm2-135m is its GGUF file).")
    served_model: str | None = optional("The model name sent with OpenAI-style requests (default: the server's "
        "own, read from /v1/models).")
    url: Annotated[str, AfterValidator(_url_text)] | None = optional(
        "openai: the running server's base URL, e.g. http://127.0.0.1:8000.")
    args: Flags = Field(default_factory=list, description="Server flags for every mode (threads, context...).")
    startup_timeout_s: Seconds = Field(300.0, description="Longest wait for the server's /health (seconds).")
    request_timeout_s: Seconds = Field(300.0, description="Longest silence in one request's reply: connecting, "
                                       "sending, and between two pieces of the reply (seconds).")
    reply_timeout_s: Seconds = Field(1800.0, description="Longest time one whole reply may take, keep-alive "
                                     "comments and all (seconds): a reply that never ends fails here.")
    use_env_proxy: StrictBool = Field(False, description="openai only: send the requests through the proxy that "
                                "HTTP_PROXY / HTTPS_PROXY / ALL_PROXY name (the proxy sees every prompt and adds "
                                "its latency to every TTFT); otherwise kvbench never uses a proxy.")
    cold: Literal["restart", "reset", "check"] | None = optional(
        "How each mode starts from an empty cache: restart the server (the default, and the only way, where kvbench "
        "starts it), call reset_path (POST; a server already running), or only check (the default for openai: a "
        "server already running); either way the first "
        "request's cached tokens must be 0, or the mode is reported as not cold.")
    reset_path: str | None = optional("The engine's cache-reset endpoint for cold: reset (POST), e.g. "
                                      "/reset_prefix_cache.")

    @model_validator(mode="after")
    def _fits_kind(self) -> EngineSpec:
        given = [k for k in ("binary", "python", "model", "served_model", "url", "reset_path")
                 if getattr(self, k) is not None] + (["args"] if self.args else []) + \
            (["use_env_proxy"] if self.use_env_proxy else [])
        if self.kind == "transformers":
            if given:
                raise ValueError(f"{', '.join(given)}: only for a server engine (kind {SERVER_KINDS_TEXT}); the "
                                 "transformers engine runs in kvbench")
            return self
        if not KINDS[self.kind].started:
            if self.url is None:
                raise ValueError(f"url: required for kind {self.kind} (the running server's base URL)")
            wrong = [k for k in ("binary", "python", "model") if getattr(self, k) is not None] + \
                (["args"] if self.args else [])
            if wrong:
                raise ValueError(f"{', '.join(wrong)}: kvbench starts nothing for kind {self.kind}; configure the "
                                 "server you started")
            _openai_url(self.url)
            if self.cold == "restart":
                raise ValueError(f"cold: restart is impossible for kind {self.kind} (kvbench did not start the "
                                 "server): use cold: reset with reset_path, or cold: check")
        elif self.use_env_proxy:
            raise ValueError(f"use_env_proxy: only for kind {RUNNING_KINDS_TEXT}; kvbench talks to the {self.kind} "
                             "server it starts on 127.0.0.1 directly")
        elif self.url is not None:
            raise ValueError(f"url: kvbench starts {self.kind} itself on 127.0.0.1; use kind {RUNNING_KINDS_TEXT} "
                             "for a server already running")
        if self.python is not None and KINDS[self.kind].python_module is None:
            raise ValueError(f"python: kind {self.kind} is a program, not a Python module; give engine.binary")
        if self.python is not None and self.binary is not None:
            raise ValueError("binary: not with engine.python (python runs the engine's module, binary is its "
                             "program): give one")
        bad = reserved_flag_problems(self.kind, self.args)
        if bad:
            raise ValueError(f"args: {bad[0]}")
        if self.cold == "reset" and self.reset_path is None:
            raise ValueError("reset_path: required with cold: reset (the engine's cache-reset endpoint)")
        if self.cold == "reset" and KINDS[self.kind].started:
            raise ValueError(f"cold: reset is for a server already running (kind {RUNNING_KINDS_TEXT}): kvbench "
                             f"starts a fresh {self.kind} server per mode (cold: restart) and opens no reset "
                             "endpoint on it")
        if self.reset_path is not None and not re.fullmatch(r"/[\w\-/]{1,200}", self.reset_path):
            raise ValueError("reset_path: must be a path such as /reset_prefix_cache")
        return self

    @property
    def server(self) -> bool:
        """A server engine (anything but transformers)."""
        return self.kind != "transformers"

    @property
    def cold_start(self) -> str:
        """``cold`` as it applies: ``restart`` for a server kvbench starts, ``check`` for ``openai``, unless set."""
        return self.cold or ("restart" if self.kind in STARTED_KINDS else "check")


def mode_flags(s: Any, mode: Any) -> tuple[list[str], dict]:
    """The flags (size filled in) and request options a server mode of scenario ``s`` gets, as the run builds them:
    the engine's, the preset's, the mode's (a later flag wins where the server reads the last one)."""
    p = preset_of(s.engine.kind, mode)
    size = mode.size if mode.size is not None else (p.size[1] if p.size else None)
    args = [a.replace("{size}", size_text(size) if size is not None else "") for a in p.args]
    return [*s.engine.args, *args, *mode.args], {**p.request, **mode.request}


def size_text(size: float) -> str:
    """A size as a server flag's value: a whole number without a decimal point, else plain decimals (never an
    exponent: ``1048576``, ``0.5``)."""
    return str(int(size)) if float(size).is_integer() else f"{size:.6f}".rstrip("0").rstrip(".")


def preset_of(kind: str, mode: ServerMode) -> Preset:
    """The preset ``mode`` starts from on engine ``kind``.

    Raises:
        LookupError: no such preset (the message lists them, with did-you-mean).
    """
    presets = PRESETS[kind]
    if mode.kind not in presets:
        raise LookupError(presets.unknown(mode.kind))
    return presets[mode.kind]


def check_server_modes(kind: str, modes: list[Any]) -> list[tuple[int, str]]:
    """What is wrong with ``modes`` on engine ``kind``: (index, message) per fault: an offload mode on a server,
    a server configuration on transformers, an unknown preset, a size its preset does not take."""
    out = []
    for i, m in enumerate(modes):
        if kind == "transformers":
            if isinstance(m, ServerMode):
                out.append((i, f"a server configuration ({m.name}) needs a server engine (engine.kind "
                            f"{SERVER_KINDS_TEXT}); the transformers engine takes offload modes with `kind`"))
            continue
        if not isinstance(m, ServerMode):
            out.append((i, f"engine {kind} takes server configurations ({{name: none}}, {{name: prefix-cache}}, ...),"
                        f" not the offload mode kind {m.kind}"))
            continue
        if m.kind not in PRESETS[kind]:
            out.append((i, f"preset: {PRESETS[kind].unknown(m.kind)}"))
            continue
        p = PRESETS[kind][m.kind]
        if m.name in PRESETS[kind] and m.name != m.kind:
            out.append((i, f"name: {m.name} is {kind}'s preset {m.name}, but this mode runs preset {m.kind}: a "
                           "mode named after a preset runs that preset; give this one another name"))
        out += [(i, f"args: {why}") for why in reserved_flag_problems(kind, m.args)]
        if m.url is None and not KINDS[kind].started and p.tier is not None:
            out.append((i, f"url: preset {p.name} measures the deployment with its tier on, another server than "
                           "engine.url (the tier off): give that server's base URL"))
        if m.url is not None:
            if KINDS[kind].started:
                out.append((i, f"url: kvbench starts {kind} itself for every mode; a mode's url is for kind "
                               f"{RUNNING_KINDS_TEXT} (a server already running)"))
            else:
                try:
                    _openai_url(m.url)
                except ValueError as exc:
                    out.append((i, str(exc)))
        if m.size is not None and p.size is None:
            out.append((i, f"size: preset {p.name} of {kind} has no size"))
        elif m.size is not None and p.whole_size and not float(m.size).is_integer():
            out.append((i, f"size: {m.size:g} {p.size[0]}: preset {p.name} of {kind} takes a whole number"))
    out += _tier_baseline(kind, modes)
    return out


def _tier_baseline(kind: str, modes: list[Any]) -> list[tuple[int, str]]:
    """A host/disk tier mode (:attr:`~kvbench.serving.kind.Preset.tier`) in ``modes`` without the kind's
    prefix-cache mode (:attr:`~kvbench.serving.kind.ServerKind.prefix_preset`) to take its tier saving against:
    (index, message) for the first such mode, naming the mode to add."""
    if kind == "transformers" or KINDS[kind].prefix_preset is None:
        return []
    base = KINDS[kind].prefix_preset
    server = [m for m in modes if isinstance(m, ServerMode) and m.kind in PRESETS[kind]]
    if any(m.kind == base for m in server):
        return []
    for i, m in enumerate(modes):
        if m in server and PRESETS[kind][m.kind].tier is not None:
            tier = PRESETS[kind][m.kind].tier
            return [(i, f"{m.name} adds a {tier} tier on top of {kind}'s prefix cache; whether that tier pays is "
                        f"its saving against the same server with the tier off, so add {{name: {base}}} to modes "
                        f"(its tier saving's baseline; `none` is the baseline of the reuse saving)")]
    return []
