"""What every importer of a peer tool's results shares: :class:`PeerRun` (one file's requests in kvbench's names
and units) and the checked walk through a foreign document (:class:`Doc`), whose errors name the file and the
key path."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.errors import ResultsError
from kvbench.safe_text import visible

#: The per-request columns of :attr:`PeerRun.requests`, in kvbench's names (seconds, tokens).
REQUEST_COLUMNS = ("key", "prompt_head", "prompt_tokens", "n_output_tokens", "ttft_s", "tpot_s", "ntpot_s", "e2e_s",
                   "itl_s",
                   "start_s", "cached_prompt_tokens", "ok")
#: The longest time a request's figure may be (seconds; 11.6 days): past it a file holds no request's time.
MAX_SECONDS = 1_000_000
#: Characters of a prompt kept in :attr:`PeerRun.requests` (``prompt_head``).
HEAD_CHARS = 64
#: The latency metrics a peer run gives, in kvbench's names (:data:`kvbench.results.rows.METRICS`).
LATENCIES = ("ttft_s", "tpot_s", "ntpot_s", "itl_s", "e2e_s")


@dataclass
class PeerRun:
    """One peer tool's result for one load (a GuideLLM benchmark, an AIPerf or ``vllm bench serve`` run, an llm-d
    Benchmark Report), in kvbench's names and units.

    Attributes:
        path: the file read.
        tool: ``guidellm``, ``aiperf``, ``vllm bench serve`` or ``llm-d report``.
        tool_version: the tool's version where the file says it.
        label: how the tables name it (the file's folder and name; a GuideLLM benchmark's strategy added).
        requests: per request (empty for an aggregates-only file): :data:`REQUEST_COLUMNS`: ``key`` (what pairs
            it with the same request of another file: a digest of the prompt text, or its index; see
            ``pairing``), prompt and output tokens, TTFT/TPOT/NTPOT/e2e in seconds, ``itl_s`` (the inter-chunk gaps
            in seconds, or None where the tool keeps none), ``start_s`` (from the first request's start),
            ``cached_prompt_tokens`` (None where not reported), ``ok`` (False: the request failed).
        aggregates: the tool's own figures, metric (:data:`LATENCIES`) → ``{"p50", "p90", "p99", "mean"}`` in
            seconds (those the file gives), normalised to kvbench's definitions.
        output_tokens_per_s: generated tokens ÷ the load's wall-clock seconds, as the tool measured it.
        concurrency: requests the tool kept in flight (None: not said, e.g. a rate-driven load).
        pairing: how ``key`` was made (``prompt text``, ``request index``), or ``""`` with no requests.
        notes: what was normalised or is missing, one line each (shown with the tables).
        shared_prefix_tokens: the tokens every prompt of a shared-prefix workload starts with, as the tool's
            configuration says (None: not said, or not one prefix length).
        prefixes: how many such prefixes the workload rotates over (its working set; None: not said).
        reported_requests: an aggregates-only file's own count of successful requests (None: not said).
        reported_cached_share: an aggregates-only file's prefix-cache hit rate as a fraction (None: not said).
        none_mode: an llm-d report kvbench exported of its mode ``none`` (the reference of a folder of them).
    """

    path: Path
    tool: str
    tool_version: str | None
    label: str
    requests: pd.DataFrame
    aggregates: dict[str, dict[str, float]] = field(default_factory=dict)
    output_tokens_per_s: float | None = None
    concurrency: int | None = None
    pairing: str = ""
    notes: list[str] = field(default_factory=list)
    shared_prefix_tokens: int | None = None
    prefixes: int | None = None
    reported_requests: int | None = None
    reported_cached_share: float | None = None
    none_mode: bool = False

    @property
    def per_request(self) -> bool:
        """The file holds its requests (not only aggregates)."""
        return len(self.requests) > 0


def check_requests(file: Path, rows: list[dict[str, Any]], where: str) -> None:
    """Refuse requests whose times cannot be: a negative TTFT, e2e or inter-chunk gap, an e2e of 0 s for generated
    tokens, or an e2e shorter than the TTFT (``where``: how the message names a request, e.g. ``ttfts[{i}]``).

    Raises:
        ResultsError: naming the file, the request and the figures.
    """
    for i, r in enumerate(rows):
        name = where.format(i=i)
        for col in ("ttft_s", "e2e_s"):
            if r.get(col) is not None and r[col] > MAX_SECONDS:
                raise ResultsError(f"{file}: {name}: {col.removesuffix('_s').upper()} {r[col]:g} s is past "
                                   f"{MAX_SECONDS:,} s: not a request's time")
        for col in ("ttft_s", "e2e_s"):
            if r.get(col) is not None and r[col] < 0:
                raise ResultsError(f"{file}: {name}: {col.removesuffix('_s').upper()} {r[col]:g} s is negative")
        if r.get("e2e_s") == 0 and (r.get("n_output_tokens") or 0) > 0:
            raise ResultsError(f"{file}: {name}: e2e 0 s for {r['n_output_tokens']} generated tokens: no request "
                               "takes no time")
        if r.get("ttft_s") is not None and r.get("e2e_s") is not None and r["e2e_s"] < r["ttft_s"] - 1e-6:
            raise ResultsError(f"{file}: {name}: e2e {r['e2e_s']:g} s is shorter than its TTFT {r['ttft_s']:g} s")
        if r.get("tpot_s") is not None and r["tpot_s"] < 0:
            raise ResultsError(f"{file}: {name}: TPOT {r['tpot_s']:g} s is negative")
        if r.get("itl_s") and min(r["itl_s"]) < 0:
            raise ResultsError(f"{file}: {name}: an inter-chunk gap of {min(r['itl_s']):g} s is negative")


def requests_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """:data:`REQUEST_COLUMNS` of ``rows`` (dicts), ``start_s`` made relative to the earliest start."""
    frame = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    if len(frame) and frame["start_s"].notna().any():
        frame["start_s"] = frame["start_s"] - frame["start_s"].min()
    return frame


def prompt_key(text: str) -> str:
    """The pairing key of a prompt: 16 hex digits of the SHA-256 of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def tpot(e2e: float | None, ttft: float | None, n: int | None) -> float | None:
    """kvbench's TPOT, (e2e − TTFT) ÷ (n − 1) seconds (decode only); None for n < 2 or a missing figure."""
    if e2e is None or ttft is None or n is None or n < 2:
        return None
    return (e2e - ttft) / (n - 1)


class Doc:
    """A checked walk through a parsed foreign document: ``Doc(file, data)``; :meth:`at` follows a key path and
    each reader names the file and the path where the document is not what the tool writes."""

    def __init__(self, file: Path, data: Any, where: str = ""):
        self.file, self.data, self.where = file, data, where

    def _fail(self, path: str, why: str) -> ResultsError:
        return ResultsError(f"{self.file}: {path or '(top level)'}: {why}")

    def _path(self, key: str | int) -> str:
        step = f"[{key}]" if isinstance(key, int) else key
        return f"{self.where}{step}" if isinstance(key, int) or not self.where else f"{self.where}.{step}"

    def has(self, key: str) -> bool:
        """``key`` is in this object and not null."""
        return isinstance(self.data, dict) and self.data.get(key) is not None

    def at(self, *keys: str | int, optional: bool = False) -> Doc | None:
        """The value at ``keys`` below this one (None with ``optional`` where a step is missing or null).

        Raises:
            ResultsError: a step missing (without ``optional``), or taken into a value that is not an object or
                list (naming the file and key path).
        """
        node: Doc = self
        for key in keys:
            want = list if isinstance(key, int) else dict
            if not isinstance(node.data, want):
                raise self._fail(node.where, f"must be {'a list' if want is list else 'an object'}, not "
                                             f"{type(node.data).__name__}")
            path = node._path(key)
            missing = (key >= len(node.data)) if isinstance(key, int) else node.data.get(key) is None
            if missing:
                if optional:
                    return None
                raise self._fail(path, "missing")
            node = Doc(self.file, node.data[key], path)
        return node

    def items(self) -> list[Doc]:
        """The elements of this list.

        Raises:
            ResultsError: it is not a list.
        """
        if not isinstance(self.data, list):
            raise self._fail(self.where, f"must be a list, not {type(self.data).__name__}")
        return [Doc(self.file, v, self._path(k)) for k, v in enumerate(self.data)]

    def number(self, *keys: str | int, optional: bool = False, least: float | None = None) -> float | None:
        """The finite number at ``keys`` (None with ``optional`` where missing).

        Raises:
            ResultsError: missing (without ``optional``), not a number, not finite, or below ``least``.
        """
        node = self.at(*keys, optional=optional) if keys else self
        if node is None:
            return None
        v = node.data
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            if isinstance(v, str):  # vLLM writes its request rate "inf" as text
                try:
                    v = float(v)
                except ValueError:
                    raise self._fail(node.where, f"must be a number, not {v[:40]!r}") from None
            else:
                raise self._fail(node.where, f"must be a number, not {type(v).__name__}")
        try:
            finite = math.isfinite(v)
        except OverflowError:  # an int past float's range
            raise self._fail(node.where, "must be a number within range, not a number of "
                                         f"{len(str(abs(int(v))))} digits") from None
        if not finite:
            if optional:
                return None
            raise self._fail(node.where, f"must be a finite number, not {v}")
        if least is not None and v < least:
            raise self._fail(node.where, f"must be at least {least:g}, not {v:g}")
        return float(v)

    def count(self, *keys: str | int, optional: bool = False) -> int | None:
        """The whole number ≥ 0 at ``keys`` (None with ``optional`` where missing).

        Raises:
            ResultsError: missing (without ``optional``), or not a whole number ≥ 0.
        """
        v = self.number(*keys, optional=optional, least=0)
        if v is None:
            return None
        if v != int(v):
            node = self.at(*keys) if keys else self
            raise self._fail(node.where if node else self.where, f"must be a whole number, not {v:g}")
        return int(v)

    def text(self, *keys: str | int, optional: bool = False) -> str | None:
        """The string at ``keys`` (None with ``optional`` where missing).

        Raises:
            ResultsError: missing (without ``optional``), or not a string.
        """
        node = self.at(*keys, optional=optional) if keys else self
        if node is None:
            return None
        if not isinstance(node.data, str):
            raise self._fail(node.where, f"must be text, not {type(node.data).__name__}")
        return node.data

    def numbers(self, *keys: str | int, optional: bool = False) -> list[float] | None:
        """The list of finite numbers at ``keys`` (None with ``optional`` where missing).

        Raises:
            ResultsError: missing (without ``optional``), not a list, or an element not a finite number.
        """
        node = self.at(*keys, optional=optional) if keys else self
        if node is None:
            return None
        return [float(item.number()) for item in node.items()]


def short_label(path: Path, parts: int = 3) -> str:
    """A file's label: its last ``parts`` path components (fewer where the path has fewer; no root), through
    :func:`~kvbench.safe_text.visible` (a name that is not UTF-8 shows its bytes as ``\xff``: every table, file
    and chart can carry it)."""
    names = [p for p in path.parts if p not in (path.anchor, "")]
    return visible("/".join(names[-parts:]) or str(path))


def scaled(values: dict[str, float | None], scale: float) -> dict[str, float]:
    """``values`` without the missing ones, each times ``scale`` (ms → s: 1e-3)."""
    return {k: v * scale for k, v in values.items() if v is not None}


__all__ = ["Doc", "HEAD_CHARS", "LATENCIES", "PeerRun", "REQUEST_COLUMNS", "check_requests", "prompt_key",
           "requests_frame", "scaled", "short_label", "tpot"]
