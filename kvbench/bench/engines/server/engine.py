"""A serving engine as the sweep sees it: per mode (a server configuration) and repeat, a server started on
127.0.0.1 from a cold cache, the requests sent to it, its ``/metrics`` read before and after.

:class:`ServerEngine` knows the engine kinds' command lines (:func:`server_argv`), their endpoints and their
presets (:data:`kvbench.scenario.servers.PRESETS`); the order of modes and requests, the load and the rows are the
server sweep's (:mod:`kvbench.bench.plans.server`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.bench.engines.base import Capabilities
from kvbench.bench.engines.quality import ServerQuality
from kvbench.bench.trial import TrialOutput
from kvbench.bench.rows.reference import Reference
from kvbench.bench.rows.row import ids_digest
from kvbench.bench.engines.server.client import Reply
from kvbench.bench.engines.server.keys import keys_file, server_keys
from kvbench.bench.engines.server.http import get_page, served_model, served_version, unreachable
from kvbench.bench.engines.server.metrics import measured_deltas
from kvbench.bench.engines.server.process import ServerProcess, free_port, probe_output
from kvbench.bench.engines.server.requests import prompt_requests, reusable_tokens, working_set_tokens
from kvbench.bench.engines.server.session import ServerSession
from kvbench.bench.engines.server.stream import ServerReplyError, printable
from kvbench.bench.engines.server.tiers import host_tier, tier_tokens
from kvbench.bench.telemetry.server import listening_pid
from kvbench.bench.trial import ServerTrial
from kvbench.errors import SymlinkRefused
from kvbench.scenario import Scenario
from kvbench.scenario.programs import Program, server_program
from kvbench.scenario.servers import Preset, loopback_url, preset_of, size_text
from kvbench.serving import KINDS, metrics_kind
from kvbench.serving.kind import Launch
from kvbench.workloads.shared_prefix import cell_tokens

#: Tokens of the warm-up prompt sent before a mode's requests (unrecorded; shares no prefix with them).
WARMUP_TOKENS = 32
#: Prompt tokens a slot holds beyond the longest request (the generated tokens come on top).
CTX_MARGIN = 16


#: What a server engine has: no memory of its own to give back (its server stops after each mode), no OOM told
#: apart, as many requests in flight as the load's level gives it slots.
CAPABILITIES = Capabilities(releases_memory=False, tells_oom=False, max_in_flight=None)


def server_argv(s: Scenario, preset: Preset, mode: Any, port: int, slots: int, ctx_per_slot: int,
                slot_dir: Path, model_dir: str | None = None, device: str = "cpu",
                kv_bytes: int | None = None, program: Program | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line of ``mode``'s server and the variables its environment gets over kvbench's: the program
    (:func:`~kvbench.scenario.programs.server_program`), the kind's words before the flags (vLLM's model as
    ``serve``'s positional word, its defaults), the engine's flags, the preset's, the mode's (a later flag wins
    where the server reads the last one), then kvbench's own last: the model, 127.0.0.1 and ``port``, metrics on,
    slots, context and seed, so that no earlier word can change where the server listens (the scenario's flags
    cannot name these either: :func:`~kvbench.scenario.server_flags.reserved_flag_problems`). ``slots``: parallel
    requests; ``ctx_per_slot``: tokens each holds; ``model_dir``: what the server loads when ``engine.model`` is
    not given (the scenario's model exported as a Hugging Face directory, :func:`load_server_engine`);
    ``device``: what it computes on; ``kv_bytes``: the slots' full KV (bytes); ``program``: the server's program
    when the caller has it already (default: looked up). The kind's
    :attr:`~kvbench.serving.kind.ServerKind.launch` gives the words around the scenario's and
    :attr:`~kvbench.serving.kind.ServerKind.environment` the variables."""
    e, kind = s.engine, KINDS[s.engine.kind]
    program = program or server_program(e)
    size = mode.size if mode.size is not None else (preset.size[1] if preset.size else None)
    args = [a.replace("{size}", size_text(size) if size is not None else "").replace("{slot_dir}", str(slot_dir))
            for a in preset.args]
    at = Launch(e.model or model_dir, s.model.name, port, slots, ctx_per_slot, s.seed,
                module=program is not None and program.module, device=device, kv_bytes=kv_bytes,
                offline=Path(e.model).exists() if e.model else model_dir is not None,
                flags=(*e.args, *mode.args))
    head, own = kind.launch(at)
    env = kind.environment(at) if kind.environment is not None else {}
    return [*(program.argv if program else ()), *head, *e.args, *args, *mode.args, *own], env


def program_version(argv: Sequence[str]) -> str | None:
    """The first line a server's program (``argv[0]``) prints for ``--version`` (llama-server, vllm), or None;
    asked once per program (:func:`_version_of`)."""
    return _version_of(argv[0]) if argv else None


@functools.lru_cache(maxsize=None)
def _version_of(program: str) -> str | None:
    text = (probe_output([program, "--version"]) or "").strip().splitlines()
    return printable(text[0], 200) if text else None


def running_pid(url: str) -> int | None:
    """The process serving ``url`` when it is on this machine (a loopback URL): the one listening on its port
    (:func:`~kvbench.bench.telemetry.server.listening_pid`); None for another machine's server, whose CPU is not
    this machine's load."""
    if not loopback_url(url):
        return None
    parts = urllib.parse.urlsplit(url)
    return listening_pid(parts.port or (443 if parts.scheme == "https" else 80))


class ServerEngine:
    """Runs a scenario's requests on a server engine (``engine.kind`` llama.cpp, vllm, sglang or openai).

    Attributes:
        source: the requests (:class:`~kvbench.workloads.sessions.Stream`).
        device: what the server computes on (``type`` ``cpu`` or ``cuda``), for the samplers.
        pid: the running server's process (this one's when none runs: ``openai``).
        reference: the ``none`` outputs every request is compared with.
    """

    def __init__(self, s: Scenario, source: Any, run_path: Path, max_positions: int, device_type: str = "cpu",
                 vocab_size: int = 32_000, model_dir: str | None = None, kv_bytes_per_token: int = 0):
        self.s, self.source, self.run_path, self.vocab_size = s, source, Path(run_path), vocab_size
        #: KV bytes one token takes in the model's every layer at 4 bytes per element (a server's KV space)
        self.kv_bytes_per_token = kv_bytes_per_token
        #: what a started server loads when ``engine.model`` is not given (see :func:`load_server_engine`)
        self.model_dir = model_dir
        self.kind = s.engine.kind
        #: what kvbench knows of the kind (:data:`kvbench.serving.KINDS`)
        self.server_kind = KINDS[self.kind]
        import torch

        self.device = torch.device(device_type)
        #: NVML of the server's GPU (a server on a CUDA machine), for its per-PID memory; None on a CPU
        self.nvml = None
        if device_type == "cuda":
            from kvbench.bench.telemetry.nvml import NvmlReader
            from kvbench.errors import NvmlUnavailable

            with contextlib.suppress(NvmlUnavailable):
                self.nvml = NvmlReader(torch.device("cuda:0") if s.device in ("auto", "cuda") else
                                       torch.device(s.device))
        self.device_name = f"{self.kind} server ({device_type})"
        self.pid = os.getpid()
        self.reference = Reference()
        self.quality = ServerQuality(any(self.preset(m).lossy for m in s.modes))
        self.capabilities = CAPABILITIES
        self.weights_bytes = None  # in the server's process, not read
        #: requests a later request of the same conversation follows (their ``held`` ids are sent after them)
        later = [q.document for q in source.requests]
        self.followed = {q.id for i, q in enumerate(source.requests) if q.document in later[i + 1:]}
        longest = max((len(q.held) if q.id in self.followed else len(q.ids) for q in source.requests), default=0)
        self.ctx_per_slot = min(max_positions, longest + s.max_new_tokens + CTX_MARGIN)
        self.longest_prompt = max_positions - s.max_new_tokens
        self.served_model: str | None = s.engine.served_model
        #: requests go through the environment's proxies only for an openai engine that says use_env_proxy
        self.trust_env = not self.server_kind.started and s.engine.use_env_proxy
        self.servers: list[dict[str, Any]] = []
        self.reusable = reusable_tokens(source.requests)
        #: the workload's working set: per conversation (document), its longest prompt with the reply held
        self.working_set_tokens = working_set_tokens(source.requests, self.followed)
        #: shared_prefix: the units a prefix is held in (0: whole prompts, llama.cpp) and each cell's KV in tokens
        self.share_unit = 0 if self.server_kind.slot_per_unit else 1
        self.cell_tokens = cell_tokens(source.requests, self.share_unit)
        #: the host tier each mode's server was started with, in bytes (by label; 0: none or not known)
        self.host_tiers: dict[str, int] = {}

    def preflight(self) -> list[str]:
        """Why the requests cannot run (one line each): a prompt longer than the model's positions allow; an
        ``openai`` server that does not answer at ``engine.url`` or a mode's ``url`` (asked for ``/v1/models``, 10 s
        at most each), or,
        without ``engine.served_model``, lists no model there (the one it lists is the model sent)."""
        out = []
        too_long = [q.id for q in self.source.requests if len(q.ids) > self.longest_prompt]
        if too_long:
            out.append(f"{len(too_long)} requests ({', '.join(too_long[:3])}...) have prompts longer than "
                       f"{self.longest_prompt} tokens (the model's positions less max_new_tokens)")
        if not self.server_kind.started:
            keys = {self.s.engine.url: "engine.url"}
            for i, m in enumerate(self.s.modes):
                keys.setdefault(m.url or self.s.engine.url, f"modes[{i}].url")
            for base, key in keys.items():
                url = f"{base}/v1/models"
                if (why := unreachable(url, self.trust_env)) is not None:
                    out.append(f"{key}: nothing answers at {url} ({why}): start the server first, or fix {key}")
                elif self.served_model is None and (name := served_model(get_page(url, self.trust_env))) is None:
                    out.append(f"{key}: {url} lists no served model (no 200 with an OpenAI model list: is this "
                               "an OpenAI-compatible server, at its base URL?); give engine.served_model if it "
                               "serves /v1/completions without /v1/models")
                elif self.served_model is None:
                    self.served_model = name
        return out

    def preset(self, mode: Any) -> Preset:
        """The preset ``mode`` starts from."""
        return preset_of(self.kind, mode)

    @contextlib.contextmanager
    def session(self, mode: Any, repeat: int, slots: int = 1) -> Iterator[ServerSession]:
        """``mode``'s server session for ``repeat``, from a cold cache: a server started (on 127.0.0.1, a free
        port, its log in ``servers/<mode>-r<repeat>.log`` of the run, ``.2.log`` for a resumed mode's next server,
        ``slots`` parallel slots, fresh keys where its kind checks them: :mod:`~kvbench.bench.engines.server.keys`)
        and stopped on every exit path; for ``openai`` the running server,
        reset through ``engine.reset_path`` when ``cold: reset``. Its command line, version and ``/metrics``
        deltas (from :attr:`ServerSession.metrics_before`, which the caller reads when its measured requests
        start, to the end) go into :attr:`servers` (the run's ``servers`` in run.json).

        Raises:
            ServerStartError: the server did not start or never became healthy (the log's last lines say why).
        """
        e, preset = self.s.engine, self.preset(mode)
        servers_dir = self.run_path / "servers"
        for d in (servers_dir, servers_dir / f"{mode.label}-r{repeat}.slots"):
            if d.is_symlink():
                raise SymlinkRefused(d)
        servers_dir.mkdir(exist_ok=True)
        info: dict[str, Any] = {"mode_label": mode.label, "repeat": repeat, "engine": self.kind, "slots": slots}
        keys = None
        if not self.server_kind.started:
            url = mode.url or e.url
            srv = ServerSession(self, mode, url, None, preset, info, host_tier=host_tier(self.kind, None))
            srv.pid = running_pid(url)
            info["url"] = url
            info["pid"] = srv.pid  # its CPU is the trial's own, its memory sampled; None: not on this machine's view
        else:
            slot_dir = servers_dir / f"{mode.label}-r{repeat}.slots"
            if preset.slots:
                slot_dir.mkdir(exist_ok=True)
            port = free_port()
            program = server_program(e)
            argv, env = server_argv(self.s, preset, mode, port, slots, self.ctx_per_slot, slot_dir, self.model_dir,
                                    self.device.type, self.kv_bytes_per_token * self.ctx_per_slot * slots, program)
            keys = server_keys(self.server_kind.private_keys, servers_dir, f"{mode.label}-r{repeat}")
            argv += keys.argv if keys is not None else ()
            log = servers_dir / f"{mode.label}-r{repeat}.log"
            n = 1
            while log.exists() or log.is_symlink():  # a resumed mode's new server: the earlier log stays
                n += 1
                log = servers_dir / f"{mode.label}-r{repeat}.{n}.log"
            proc = ServerProcess(argv, log, port=port, startup_timeout_s=e.startup_timeout_s,
                                 env={**os.environ, **env} if env else None)
            info.update(argv=argv, environment=env, log=str(log.relative_to(self.run_path)),
                        version=None if program is not None and program.module else program_version(argv))
            srv = ServerSession(self, mode, proc.url, proc, preset, info,
                                slot_dir=slot_dir if preset.slots else None, host_tier=host_tier(self.kind, argv))
            info["host_tier_bytes"], info["host_tier"] = srv.host_tier
            srv.headers = keys.headers if keys is not None else {}
        self.host_tiers[mode.label] = srv.host_tier[0] or 0
        self.servers.append(info)
        with keys_file(keys), srv.process if srv.process is not None else contextlib.nullcontext():
            if srv.process is not None:
                srv.pid = srv.process.pid
            if srv.pid is not None:
                self.pid = srv.pid
                if info.get("version") is None and self.server_kind.version_path:
                    info["version"] = served_version(get_page(srv.url + self.server_kind.version_path, False))
            if e.cold_start == "reset":
                srv.post(e.reset_path)
                info["reset"] = e.reset_path
            try:
                yield srv
            finally:
                after = srv.metrics_text() if srv.process is None or srv.process.alive() else None
                kind = self.kind if self.server_kind.counters else metrics_kind(srv.metrics_before or after or "")
                info.update(measured_deltas(kind, srv.metrics_before, after, srv.holds.scrapes, srv.holds.sent,
                                            f"{srv.url}/metrics"))
                if self.server_kind.block_tokens is not None:  # prefix caching reuses whole blocks of these
                    info["cache_block_tokens"] = self.server_kind.block_tokens(srv.metrics_before or after or "")
                info.update(self._capacity(srv.metrics_before or after or "", slots))
                self.pid = os.getpid()

    def _capacity(self, metrics: str, slots: int) -> dict[str, Any]:
        """run.json's capacity facts of a server: ``device_cache_tokens`` (the KV tokens it keeps on its device:
        the kind's reading of its ``/metrics``, vLLM's blocks × block size; llama.cpp's slots × the context kvbench
        gave each; None: not known), where that figure comes from (``device_cache_source``) and the workload's
        ``working_set_tokens`` (:attr:`working_set_tokens`)."""
        reader = KINDS[self.kind if self.server_kind.counters else metrics_kind(metrics)].device_cache_tokens
        tokens, source = (reader(metrics), "its /metrics") if reader is not None else (None, "")
        if self.server_kind.started and self.server_kind.slot_per_unit:
            tokens, source = self.ctx_per_slot * slots, f"{slots} slots × {self.ctx_per_slot} tokens of context"
        return {"device_cache_tokens": tokens, "device_cache_source": source if tokens is not None else
                "not reported by the server", "working_set_tokens": self.working_set_tokens}

    def model_name(self, url: str, headers: dict[str, str] | None = None) -> str:
        """The model an OpenAI-compatible request names: ``engine.served_model``, else the first model the
        server at ``url`` lists (asked once, with ``headers``).

        Raises:
            ServerReplyError: the server lists none.
        """
        if self.served_model is None:
            self.served_model = served_model(get_page(url + "/v1/models", self.trust_env, headers=headers))
            if self.served_model is None:
                raise ServerReplyError(f"{url}/v1/models: lists no served model; give engine.served_model", url)
        return self.served_model

    def warmup_ids(self) -> list[int]:
        """A seeded prompt of :data:`WARMUP_TOKENS` ids below the vocabulary's size whose first id starts no request
        (so a warm-up leaves nothing a request could reuse)."""
        firsts = {q.ids[0] for q in self.source.requests if q.ids}
        rng = np.random.default_rng(self.s.seed)
        ids = [int(x) for x in rng.integers(min(100, self.vocab_size // 2), self.vocab_size, WARMUP_TOKENS)]
        while ids[0] in firsts:
            ids[0] = (ids[0] + 1) % self.vocab_size
        return ids

    def describe(self, t: ServerTrial) -> dict[str, Any]:
        """The engine's fields every request's row has, whatever its status (see
        :meth:`kvbench.bench.engines.base.Engine.describe`): the server's device; no dtype or KV prediction."""
        return {"device": self.device_name, "dtype": None, "kv_bytes_predicted": None}

    def request_fields(self, t: ServerTrial) -> dict[str, Any]:
        """The request's own fields every row of ``t`` has: its id, conversation, turn, whether it may reuse, its
        shared prefix, working set, share unit and cell's KV in tokens (``shared_prefix``), the KV it keeps for
        reuse in tokens (``kv_budget_tokens``: the slots' context and the host tier its mode's server was started
        with, :func:`~kvbench.bench.engines.server.tiers.tier_tokens`), the engine, the load profile and level, the
        prompt tokens an earlier request held (``reusable_prompt_tokens``) and the prompt's digest."""
        req = t.request
        return {
            "request_id": req.id, "document": req.document, "turn_index": req.turn_index, "warm": t.warm,
            "shared_prefix_tokens": req.shared_prefix_tokens, "working_set_prompts": req.working_set,
            "shared_pct": req.shared_pct, "cell_kv_tokens": self.cell_tokens.get(req.cell),
            "share_unit_tokens": self.share_unit if req.cell is not None else None,
            "kv_budget_tokens": self.ctx_per_slot * t.concurrency
            + tier_tokens(self.host_tiers.get(t.mode.label), self.kv_bytes_per_token),
            "engine": self.kind, "load_profile": self.s.load_spec.profile, "concurrency": t.concurrency,
            "reusable_prompt_tokens": self.reusable.get(req.id), "prompt_sha256": ids_digest([list(req.ids)])}

    def output(self, t: ServerTrial, reply: Reply, first: bool = False) -> TrialOutput:
        """A server's reply to request ``t`` as the row builder takes it (:func:`kvbench.bench.rows.row.measured_fields`):
        its timestamps (per token and per chunk), its ids where the server returned them, its text's digest (the
        output every request of a server run is compared by), the cached prompt tokens it reported as the reuse
        reading, and the server's own fields. ``first``: the first request this server answered, whose cached
        tokens must be 0 (``cold_verified``). A cold preset's request that reused tokens is ``contaminated`` and
        is neither compared with nor taken as the reference."""
        req = t.request
        cached, reusable = reply.cached_tokens, self.reusable.get(req.id)
        kept = reply.slot_kept
        contaminated = bool(self.preset(t.mode).cold and cached)
        notes = {}
        if cached is None:
            notes["cached_prompt_tokens"] = "the server does not report cached prompt tokens"
        if reply.prompt_tokens is not None and reply.prompt_tokens != len(req.ids):
            notes["server_prompt_tokens"] = (f"the server counted {reply.prompt_tokens} prompt tokens, kvbench sent "
                                             f"{len(req.ids)}")
        preset, digest = self.preset(t.mode), ids_digest([list(req.ids)])
        fields = self.quality.fields(digest, preset.cold and not contaminated, preset.lossy, reply.ids,
                                     reply.top_logprobs, notes, floor=not preset.cold)
        return TrialOutput(
            t_start=reply.t_sent, token_times=reply.token_times, chunk_times=reply.chunk_times,
            ids=[reply.ids] if reply.ids is not None else None, prompt_sha256=digest,
            output_sha256=reply.text_sha256, memory={},
            reuse={"tokens_restored": cached, "tokens_prefilled": len(req.ids) - cached if cached is not None else None,
                   "store_hit_rate": min(1.0, cached / reusable) if cached is not None and reusable else None},
            fields={"cached_prompt_tokens": cached, "server_prompt_tokens": reply.prompt_tokens,
                    "tier_hit_tokens": max(0, cached - kept) if cached is not None and kept is not None else None,
                    "cached_prompt_share": cached / len(req.ids) if cached is not None and req.ids else None,
                    "server_tpot_s": reply.server_timings.get("per_token_s"),
                    "server_prompt_s": reply.server_timings.get("prompt_s"), "stop_reason": reply.stop_reason,
                    "contaminated": contaminated,
                    "cold_verified": (cached == 0) if first and cached is not None else None, **fields},
            notes=notes,
            not_compared=(f"a cold mode's request reused {cached} cached prompt tokens: not taken as the reference"
                          if contaminated else None))

    def trials(self, mode: Any, repeat: int, requests: Sequence[Any], concurrency: int = 1) -> list[ServerTrial]:
        """The trials of ``requests`` in ``mode`` and ``repeat`` at ``concurrency`` (warm unless the preset is
        cold)."""
        warm = not self.preset(mode).cold
        return [dataclasses.replace(ServerTrial.of(q, mode, repeat, warm), concurrency=concurrency)
                for q in requests]


def load_server_engine(s: Scenario, run_path: Path) -> ServerEngine:
    """The engine of a server run: the model's tokenizer (the prompts go as token ids) and the workload's
    requests; nothing is started yet. For a kind kvbench starts that loads a Hugging Face directory (vLLM,
    SGLang) without ``engine.model``, the scenario's model as such a directory, so that the server runs the
    weights kvbench tokenizes with: a GGUF exported once and reused (:func:`kvbench.models.export.hf_directory`).

    Raises:
        kvbench.errors.ModelNotFound, NotEnoughRequests, ModuleNotFoundError: as the in-process engine's loading.
        kvbench.errors.ModelLoadError, UnwritableOutput, SymlinkRefused: the export
            (:func:`~kvbench.models.export.export_gguf`).
    """
    from kvbench.models import read_architecture
    from kvbench.models.load import load_tokenizer
    from kvbench.workloads import make_source, make_stream

    arch = read_architecture(s.model)
    tokenizer = load_tokenizer(s.model.name, s.model.trust_remote_code)
    longest = arch.max_positions - s.max_new_tokens
    if s.workload.reuse:
        source = make_stream(s.workload, tokenizer, longest)
    else:
        source = prompt_requests(s, make_source(s.workload, tokenizer, arch.vocab_size, longest))
    from kvbench.models import resolve_device

    kind, model_dir = KINDS[s.engine.kind], None
    if kind.started and kind.model_format == "hf" and s.engine.model is None and s.model.name is not None:
        from kvbench.models.export import hf_directory

        model_dir = str(hf_directory(s.model.name).path)
    return ServerEngine(s, source, run_path, arch.max_positions, resolve_device(s.device).type, arch.vocab_size,
                        model_dir, arch.kv_bytes(1, 4))
