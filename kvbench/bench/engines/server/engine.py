"""A serving engine as the sweep sees it: per mode (a server configuration) and repeat, a server started on
127.0.0.1 from a cold cache (:meth:`ServerEngine.session`), the requests sent to it, its ``/metrics`` read before
and after.

:class:`ServerEngine` knows the engine kinds' command lines (:mod:`~kvbench.bench.engines.server.launch`), their
endpoints and their presets (:data:`kvbench.scenario.servers.PRESETS`); a mode's load and the server's failures
are :mod:`~kvbench.bench.engines.server.mode_run`'s, its rows :mod:`~kvbench.bench.engines.server.rows`'; the order
of modes and levels is the server plan's (:mod:`kvbench.bench.plans.server`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.bench.engines.base import Capabilities
from kvbench.bench.engines.quality import ServerQuality
from kvbench.bench.rows.reference import Reference
from kvbench.bench.engines.server.keys import keys_file, server_keys
from kvbench.bench.engines.server.http import get_page, served_model, served_version, unreachable
from kvbench.bench.engines.server.launch import program_version, running_pid, server_argv
from kvbench.bench.engines.server.metrics import measured_deltas
from kvbench.bench.engines.server.process import ServerProcess, free_port
from kvbench.bench.engines.server.requests import reusable_tokens, working_set_tokens
from kvbench.bench.engines.server.session import ServerSession
from kvbench.bench.engines.server.stream import ServerReplyError
from kvbench.bench.engines.server.tiers import host_tier
from kvbench.bench.trial import ServerTrial, TrialSpec
from kvbench.errors import SymlinkRefused
from kvbench.scenario import Scenario
from kvbench.scenario.programs import server_program
from kvbench.scenario.servers import Preset, preset_of
from kvbench.serving import KINDS, metrics_kind
from kvbench.workloads.shared_prefix import cell_tokens

#: Tokens of the warm-up prompt sent before a mode's requests (unrecorded; shares no prefix with them).
WARMUP_TOKENS = 32
#: Prompt tokens a slot holds beyond the longest request (the generated tokens come on top).
CTX_MARGIN = 16


#: What a server engine has: no memory of its own to give back (its server stops after each mode), no OOM told
#: apart.
CAPABILITIES = Capabilities(releases_memory=False, tells_oom=False)


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
        self.kind_spec = KINDS[self.kind]
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
        self.weights_bytes: int | None = None  # in the server's process, not read
        #: requests a later request of the same conversation follows (their ``held`` ids are sent after them)
        later = [q.document for q in source.requests]
        self.followed = {q.id for i, q in enumerate(source.requests) if q.document in later[i + 1:]}
        longest = max((len(q.held) if q.id in self.followed else len(q.ids) for q in source.requests), default=0)
        self.ctx_per_slot = min(max_positions, longest + s.max_new_tokens + CTX_MARGIN)
        self.longest_prompt = max_positions - s.max_new_tokens
        self.served_model: str | None = s.engine.served_model
        #: requests go through the environment's proxies only for an openai engine that says use_env_proxy
        self.trust_env = not self.kind_spec.started and s.engine.use_env_proxy
        #: the run.json ``servers`` entry of each server started (or reached) so far, a resumed run's earlier ones
        #: first (:func:`~kvbench.bench.engines.server.mode_run.run_mode`)
        self.launches: list[dict[str, Any]] = []
        self.reusable = reusable_tokens(source.requests)
        #: the workload's working set: per conversation (document), its longest prompt with the reply held
        self.working_set_tokens = working_set_tokens(source.requests, self.followed)
        #: shared_prefix: the units a prefix is held in (0: whole prompts, llama.cpp) and each cell's KV in tokens
        self.share_unit = 0 if self.kind_spec.slot_per_unit else 1
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
        if not self.kind_spec.started:
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
        start, to the end) go into :attr:`launches` (the run's ``servers`` in run.json).

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
        if not self.kind_spec.started:
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
            keys = server_keys(self.kind_spec.private_keys, servers_dir, f"{mode.label}-r{repeat}")
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
        self.launches.append(info)
        with keys_file(keys), srv.process if srv.process is not None else contextlib.nullcontext():
            if srv.process is not None:
                srv.pid = srv.process.pid
            if srv.pid is not None:
                self.pid = srv.pid
                if info.get("version") is None and self.kind_spec.version_path:
                    info["version"] = served_version(get_page(srv.url + self.kind_spec.version_path, False))
            if e.cold_start == "reset":
                srv.post(e.reset_path)
                info["reset"] = e.reset_path
            try:
                yield srv
            finally:
                after = srv.metrics_text() if srv.process is None or srv.process.alive() else None
                kind = self.kind if self.kind_spec.counters else metrics_kind(srv.metrics_before or after or "")
                info.update(measured_deltas(kind, srv.metrics_before, after, srv.holds.scrapes, srv.holds.sent,
                                            f"{srv.url}/metrics"))
                if self.kind_spec.block_tokens is not None:  # prefix caching reuses whole blocks of these
                    info["cache_block_tokens"] = self.kind_spec.block_tokens(srv.metrics_before or after or "")
                info.update(self._capacity(srv.metrics_before or after or "", slots))
                self.pid = os.getpid()

    def _capacity(self, metrics: str, slots: int) -> dict[str, Any]:
        """run.json's capacity facts of a server: ``device_cache_tokens`` (the KV tokens it keeps on its device:
        the kind's reading of its ``/metrics``, vLLM's blocks × block size; llama.cpp's slots × the context kvbench
        gave each; None: not known), where that figure comes from (``device_cache_source``) and the workload's
        ``working_set_tokens`` (:attr:`working_set_tokens`)."""
        reader = KINDS[self.kind if self.kind_spec.counters else metrics_kind(metrics)].device_cache_tokens
        tokens, source = (reader(metrics), "its /metrics") if reader is not None else (None, "")
        if self.kind_spec.started and self.kind_spec.slot_per_unit:
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

    def describe(self, t: TrialSpec) -> dict[str, Any]:
        """The engine's fields every request's row has, whatever its status (see
        :meth:`kvbench.bench.engines.base.Engine.describe`): the server's device; no dtype or KV prediction."""
        return {"device": self.device_name, "dtype": None, "kv_bytes_predicted": None}

    def trials(self, mode: Any, repeat: int, requests: Sequence[Any], concurrency: int = 1) -> list[ServerTrial]:
        """The trials of ``requests`` in ``mode`` and ``repeat`` at ``concurrency`` (warm unless the preset is
        cold)."""
        warm = not self.preset(mode).cold
        return [dataclasses.replace(ServerTrial.of(q, mode, repeat, warm), concurrency=concurrency)
                for q in requests]


def load_server_engine(s: Scenario, run_path: Path, where: Path | None = None) -> ServerEngine:
    """The engine of a server run: the model's tokenizer (the prompts go as token ids) and the workload's
    requests; nothing is started yet, and first the scenario is checked against this machine (its device, the
    server's program: :func:`~kvbench.scenario.programs.cpu_refusals`,
    :func:`~kvbench.scenario.programs.server_problems`; ``where`` is the file their error names). For a kind kvbench
    starts that loads a Hugging Face directory (vLLM, SGLang) without ``engine.model``, the scenario's model as such a
    directory, so that the server runs the weights kvbench tokenizes with: a GGUF exported once and reused
    (:func:`kvbench.models.export.hf_directory`).

    Raises:
        kvbench.errors.ScenarioError: the scenario cannot run here (a CUDA device this machine lacks, a server
            program missing, a server that needs a GPU).
        kvbench.errors.ModelNotFound, NotEnoughRequests, ModuleNotFoundError: as the in-process engine's loading.
        kvbench.errors.ModelLoadError, UnwritableOutput, SymlinkRefused: the export
            (:func:`~kvbench.models.export.export_gguf`).
    """
    from kvbench.errors import ScenarioError
    from kvbench.models import read_architecture, resolve_device
    from kvbench.models.load import load_tokenizer
    from kvbench.scenario.programs import cpu_refusals, server_problems
    from kvbench.workloads import scenario_stream

    named = where if where is not None else Path(s.name)
    try:
        device = resolve_device(s.device).type
    except ValueError as exc:  # a CUDA device this machine does not have
        raise ScenarioError(named, [("device", str(exc))]) from None
    if problems := cpu_refusals(s, device) or server_problems(s):
        raise ScenarioError(named, problems)

    arch = read_architecture(s.model)
    tokenizer = load_tokenizer(s.model.name, s.model.trust_remote_code)
    longest = arch.max_positions - s.max_new_tokens
    source = scenario_stream(s, tokenizer, arch.vocab_size, longest)
    kind, model_dir = KINDS[s.engine.kind], None
    if kind.started and kind.model_format == "hf" and s.engine.model is None and s.model.name is not None:
        from kvbench.models.export import hf_directory

        model_dir = str(hf_directory(s.model.name).path)
    return ServerEngine(s, source, run_path, arch.max_positions, device, arch.vocab_size,
                        model_dir, arch.kv_bytes(1, 4))
