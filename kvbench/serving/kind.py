"""What a serving engine kind is to kvbench, declared once per kind (:mod:`kvbench.serving` holds the registry):
its presets (named server configurations), how its server is started and what flags kvbench keeps for itself,
which flags need the user's consent, how requests reach it, the ``/metrics`` counters it exports, and where its
host KV tier's size is read from.

Nothing here starts a program or opens a socket: the running code (:mod:`kvbench.bench.engines.server`) reads these
declarations, and so does the scenario's validation (:mod:`kvbench.scenario.servers`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvbench.offload.registry import Registry

MIB, GIB = 2**20, 2**30


@dataclass(frozen=True)
class Preset:
    """A named server configuration of one engine.

    Attributes:
        name: the mode name a scenario uses (``none``, ``prefix-cache``, ...).
        meaning: one line for `kvbench list modes`.
        args: server flags; ``{size}`` is replaced by the mode's ``size`` (unit in ``size``'s meaning), ``{slot_dir}``
            by the run's private slot directory.
        request: options sent with every request (llama.cpp ``cache_prompt``, ...).
        cold: the mode reuses nothing: every request's cached prompt tokens must be 0 (the reference).
        size: (unit, default) of the preset's size option, or None.
        whole_size: the size is a whole number (llama.cpp's --cache-ram takes MiB as an integer).
        slots: kvbench saves a conversation's slot after each turn and restores it before the next (a disk tier).
        needs_gpu: only useful with a GPU (the flag moves KV between GPU and host).
        cpu_refusal: why the preset cannot run on a CPU (the engine's own words where it says so), or None: kvbench
            refuses such a mode on a CPU before any server starts.
        lossy: the server holds K/V rounded (a quantized cache type): its replies get quality columns against
            ``none``'s (:func:`kvbench.bench.engines.quality.server_quality`), not an exactness check.
        tier: ``"host"`` or ``"disk"`` for a KV tier on top of the engine's prefix cache (vLLM ``cpu-offload``,
            SGLang ``hicache``, llama.cpp ``host-cache``...): its *tier saving* is taken against the kind's
            :attr:`ServerKind.prefix_preset` at the same load, beside its *reuse saving* against ``none``; None
            for a configuration without such a tier.
    """

    name: str
    meaning: str
    args: tuple[str, ...] = ()
    request: dict[str, Any] = field(default_factory=dict)
    cold: bool = False
    size: tuple[str, float] | None = None
    whole_size: bool = False
    slots: bool = False
    needs_gpu: bool = False
    cpu_refusal: str | None = None
    lossy: bool = False
    tier: Literal["host", "disk"] | None = None


@dataclass(frozen=True)
class CodeFlag:
    """A server flag that makes the server import, load or evaluate code (kvbench runs it only with
    ``--trust-server-config``).

    Attributes:
        flags: its spellings as the parser declares them, long first (``--compilation-config``, ``-cc``); kvbench
            also refuses each as argparse and vLLM's parser read it (``_`` for ``-``, ``=value``, dotted keys,
            unique prefixes).
        loads: what code it makes the server run, said in a refusal.
        source: the file of the engine's source that does it (docs list it).
        safe: values of the flag that load nothing (vLLM 0.32's ``-O3`` is an optimization level; older vLLM read
            ``-O`` as ``--compilation-config``); empty: every value counts.
    """

    flags: tuple[str, ...]
    loads: str
    source: str
    safe: tuple[str, ...] = ()


def presets(kind: str, *entries: Preset) -> Registry[Preset]:
    """The presets of ``kind`` as a registry (did-you-mean for a wrong name)."""
    return Registry(f"{kind} preset", ((p.name, p) for p in entries))


@dataclass(frozen=True)
class CounterSpec:
    """One counter kvbench reads from an engine's ``/metrics``.

    ``name`` is kvbench's name (e.g. ``"prompt_tokens_cached"``); ``sources`` are the sample names to try in order
    (the first the server reports wins; samples keep their ``_total``); ``meaning`` is one line with the unit
    (tokens, bytes, seconds, calls, blocks). ``labels`` keeps only samples with these label values (compared
    without regard to case; a value ending in ``*`` matches as a prefix, e.g. ``storage*`` also matches
    ``storage_HiCacheFile``); samples are summed over every other label (model_name, engine, ...). ``tier`` is
    ``"device"``, ``"host"`` or ``"storage"`` for a counter of prompt tokens served from that cache tier, else None.
    """

    name: str
    sources: tuple[str, ...]
    meaning: str
    labels: dict[str, str] = field(default_factory=dict)
    tier: str | None = None


def counter(name: str, sources: str | tuple[str, ...], meaning: str, tier: str | None = None,
            **labels: str) -> CounterSpec:
    """A :class:`CounterSpec`; ``sources`` one sample name or several, ``labels`` the label filter."""
    return CounterSpec(name, (sources,) if isinstance(sources, str) else sources, meaning, dict(labels), tier)


@dataclass(frozen=True)
class Launch:
    """What kvbench's own flags of a server it starts say.

    Attributes:
        engine_model: ``engine.model``: what the scenario says the server loads, or None.
        scenario_model: the scenario's ``model.name`` (loaded when ``engine_model`` is None, in the kind's format).
        port: the free port on 127.0.0.1 it listens on.
        slots: requests it runs in parallel (the load's concurrency level).
        ctx_per_slot: tokens each slot holds (prompt, held reply and generated tokens, plus a margin).
        seed: the scenario's seed.
        module: the program is a Python interpreter running the kind's :attr:`ServerKind.python_module` (vLLM's
            model is then a flag, not the ``serve`` positional word).
        device: what the server computes on (``cpu`` or ``cuda``).
        kv_bytes: KV bytes the slots hold when full (``slots`` × ``ctx_per_slot`` tokens at 4 bytes per element),
            for an engine that sizes its KV space from it (vLLM on a CPU); None: not known.
        offline: the model the server loads is on this machine (kvbench's export, or an ``engine.model`` path that
            exists), so the server needs no model hub.
        flags: the scenario's own flags for this server (``engine.args``, then the mode's), for a kind whose
            defaults give way to them (vLLM's CPU KV space to ``--kv-cache-memory-bytes``).
    """

    engine_model: str | None
    scenario_model: str
    port: int
    slots: int
    ctx_per_slot: int
    seed: int
    module: bool = False
    device: str = "cpu"
    kv_bytes: int | None = None
    offline: bool = False
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class KvSizing:
    """What reading a device cache's size from a server's flags needs beside them.

    Attributes:
        gpu: the server computes on a GPU (else a CPU).
        kv_bytes_per_token: KV bytes one token takes in every layer at the server's dtype, on one GPU (its share
            of the KV heads under tensor parallelism).
        weights_bytes: one GPU's share of the weights' bytes at that dtype, or None where the config does not give
            their size.
        gpu_bytes: the GPU's memory in bytes, and how it is known (NVML's, or an assumed GPU named).
    """

    gpu: bool
    kv_bytes_per_token: int
    weights_bytes: float | None
    gpu_bytes: tuple[int, str]


def positive(value: float | None) -> float | None:
    """``value`` when it is a finite number above 0, else None (a count or size a server would refuse)."""
    return value if value is not None and math.isfinite(value) and value > 0 else None


def fraction_capacity(argv: Sequence[str], flag: str, default: float | None, at: KvSizing
                      ) -> tuple[float | None, str] | None:
    """``(tokens, arithmetic)`` of a device cache sized as a fraction of the GPU's memory (vLLM
    ``--gpu-memory-utilization``, SGLang ``--mem-fraction-static``): at most fraction × GPU memory − weights, ÷ KV
    bytes per token (an upper bound: the engine also reserves activation memory); None on a CPU or where neither
    the flag nor a ``default`` gives the fraction; ``(None, why)`` for a fraction outside (0, 1]."""
    given = number(last_value(argv, (flag,)))
    frac = given if given is not None else default
    if frac is None or not at.gpu:
        return None
    if not 0 < frac <= 1:
        return None, f"{flag} {frac:g}: not a fraction of the GPU's memory above 0 and at most 1"
    total, which = at.gpu_bytes
    weights = at.weights_bytes or 0
    kv = max(0.0, frac * total - weights)
    told = "" if at.weights_bytes is not None else " (not subtracted: the config does not give their size)"
    return kv / at.kv_bytes_per_token, (
        f"at most {frac:g} ({flag}{'' if given is not None else ', its default'}) × {which} − "
        f"{weights / GIB:.1f} GiB of weights{told} = {kv / GIB:,.1f} GiB ÷ {at.kv_bytes_per_token:,} B of KV per "
        "token")


@dataclass(frozen=True)
class PrivateKeys:
    """Keys a server kvbench starts checks, so that no other process of the machine can use its endpoints: fresh
    random ones per server, given in a YAML file only kvbench's user can read (mode 0600, removed when the server
    stops) that :attr:`config_flag` names, never on the command line (``/proc/<pid>/cmdline`` is readable by
    every process of the machine).

    Attributes:
        config_flag: the flag that names the file (SGLang ``--config``, whose settings its command line overrides;
            llama.cpp ``--api-key-file``).
        request_key: the setting whose key kvbench's requests send (``Authorization: Bearer``).
        admin_keys: settings whose keys kvbench never sends: the endpoints they guard stay closed to everyone.
        file_format: ``yaml`` (``setting: key`` lines) or ``lines`` (the keys alone, one per line).
    """

    config_flag: str
    request_key: str
    admin_keys: tuple[str, ...] = ()
    file_format: Literal["yaml", "lines"] = "yaml"


@dataclass(frozen=True)
class ServerKind:
    """One serving engine kind (``engine.kind`` in a scenario).

    Attributes:
        name: the kind's name in scenarios and results (``llama.cpp``, ``vllm``...).
        meaning: one line for `kvbench list` and did-you-mean.
        presets: its named server configurations (:class:`Preset`).
        started: kvbench starts the server per mode (else it is already running at ``engine.url``).
        program: the argv prefix of its named program (``llama-server``; ``vllm serve``), or () where the server
            is only a Python module (SGLang); with ``engine.binary`` its words after the first are kept.
        python_module: the server as a module a Python interpreter runs (``python -m ...``): ``engine.python``,
            the interpreter of kvbench's own environment for the kind (``own_env``) or kvbench's own; None.
        own_env: the folder under kvbench's environment (``<prefix>/<own_env>``) where ``make <kind>`` installs
            the kind into a virtual environment of its own, or None.
        environment: the variables set in the server's environment (over kvbench's), from a :class:`Launch`.
        private_keys: the keys kvbench gives the server (:class:`PrivateKeys`), or None: it checks none.
        version_path: the endpoint (GET) whose JSON ``version`` names the server's version (a Python-module program
            answers ``--version`` with Python's), or None.
        block_tokens: the KV block size in tokens from a ``/metrics`` text (prefix caching reuses whole blocks),
            or None.
        cpu_refusal: why the kind's own program cannot serve on a CPU, or None: kvbench refuses it there before
            anything starts, unless ``engine.python`` or ``engine.binary`` names another build.
        install_hint: how a user gets the program where it is missing.
        reserved_flags: flags kvbench sets itself (beside ``--host`` and ``--port``), refused in a scenario.
        reserved_why: why those are kvbench's, said when one is refused.
        consent_flags: flags that make the server read or write files, fetch weights or code, run code or reach
            another machine (run only with ``--trust-server-config``).
        consent_pattern: flag names of that kind given by pattern (with the reason), or None.
        code_flags: flags that make the server import, load or evaluate code (:class:`CodeFlag`): refused without
            ``--trust-server-config`` with what each loads.
        argparse: the server parses flags with argparse (a unique prefix of a long flag is taken for it).
        launch: (words after the program, kvbench's own flags last) from a :class:`Launch`, for a started kind.
        model_format: what ``engine.model`` must be: ``gguf`` (a GGUF file), ``hf`` (a Hugging Face model
            directory or id), or None (a server kvbench does not start).
        protocol: how a request is sent: ``completion`` (llama.cpp's ``/completion``, token ids in and out) or
            ``v1-completions`` (OpenAI ``/v1/completions``).
        metrics_prefix: the prefix of its ``/metrics`` sample names (how an already running server's counters are
            told apart), or None.
        counters: the ``/metrics`` counters kvbench reads (:class:`CounterSpec`).
        hit_counts: ``(cached, all)`` prompt tokens of a mode from its counters' deltas (by kvbench name; None
            where a count is missing), the parts of its cache hit share.
        host_tier: ``(bytes, source)`` of the host KV tier a server started with the given argv may fill, or None
            (not known from flags).
        kv_element_bytes: bytes per KV element the server allocates by default (llama.cpp f16: 2), for the
            memory warning before a start; None: not estimated.
        device_cache_tokens: the KV tokens the server keeps on its device, from a ``/metrics`` text (vLLM: its
            ``num_gpu_blocks`` × ``block_size``), or None; a kind whose slots hold the context kvbench gives them
            (llama.cpp) needs none: slots × context.
        device_cache_from_flags: ``(tokens, arithmetic)`` of the KV the server keeps on its device as a command
            line (its flags, the last occurrence winning) and a :class:`KvSizing` say, ``(None, why)`` for a value
            the server would refuse, or None where they do not tell; None: not read from flags.
        device_cache_hint: the flags that size the device cache, as a message names them.
        flag_problem: why the server would refuse to start with a mode's flags (the engine's, the preset's, the
            mode's, the last occurrence winning), said by ``kvbench validate`` before anything starts; None: fine.
        tp_flags: the flags that set the server's tensor parallelism (GPUs the weights and KV heads are split over),
            the first as a message names it.
        slot_per_unit: each of the server's slots holds one conversation or document at most (llama.cpp), so its
            device cache holds as many as the load's concurrency.
        tier_counters: the counters (kvbench's names, of :attr:`counters`) that move only when a host or disk tier
            served a prompt or restored KV: the tier's own evidence that it engaged.
        prefix_preset: the preset that is the kind's prefix caching with no host or disk tier (vLLM and llama.cpp
            ``prefix-cache``, SGLang ``radix``): the baseline of a :attr:`Preset.tier` mode's tier saving, or None
            (a kind without tier presets).
        cache_policy: the trace simulator's policy closest to how the kind's prefix cache evicts
            (kvbench.traces.simulate.POLICIES or kvbench.traces.direct.DIRECT_POLICIES: vLLM frees a request's
            blocks tail first, ``lru-tail-first``; llama.cpp keeps whole prompt states, ``prompt-lru``), for
            ``kvbench trace validate``; ``lru`` where nothing closer is known.
    """

    name: str
    meaning: str
    presets: Registry[Preset]
    started: bool = True
    program: tuple[str, ...] = ()
    python_module: str | None = None
    own_env: str | None = None
    install_hint: str = ""
    reserved_flags: tuple[str, ...] = ()
    reserved_why: str = ""
    consent_flags: tuple[str, ...] = ()
    consent_pattern: tuple[re.Pattern[str], str] | None = None
    code_flags: tuple[CodeFlag, ...] = ()
    argparse: bool = False
    launch: Callable[[Launch], tuple[list[str], list[str]]] | None = None
    model_format: Literal["gguf", "hf"] | None = None
    protocol: Literal["completion", "v1-completions"] = "v1-completions"
    metrics_prefix: str | None = None
    counters: tuple[CounterSpec, ...] = ()
    hit_counts: Callable[[dict[str, float | None]], tuple[float | None, float | None]] | None = None
    host_tier: Callable[[list[str]], tuple[int | None, str]] | None = None
    kv_element_bytes: int | None = None
    environment: Callable[[Launch], dict[str, str]] | None = None
    private_keys: PrivateKeys | None = None
    version_path: str | None = None
    block_tokens: Callable[[str], int | None] | None = None
    cpu_refusal: str | None = None
    prefix_preset: str | None = None
    cache_policy: str = "lru"
    device_cache_tokens: Callable[[str], int | None] | None = None
    tier_counters: tuple[str, ...] = ()
    device_cache_from_flags: Callable[[list[str], KvSizing], tuple[float | None, str] | None] | None = None
    device_cache_hint: str = ""
    flag_problem: Callable[[list[str]], str | None] | None = None
    slot_per_unit: bool = False
    tp_flags: tuple[str, ...] = ()


def last_value(argv: Sequence[str], flags: Iterable[str]) -> str | None:
    """The value of the last of ``flags`` in ``argv`` (``--flag v`` or ``--flag=v``), or None."""
    names, found = set(flags), None
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in names:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def number(text: str | None) -> float | None:
    """``text`` as a float, or None (absent or not a number)."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
