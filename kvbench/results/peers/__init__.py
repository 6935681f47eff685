"""Result files of the field's other tools, read into kvbench's names and units: GuideLLM (JSON or YAML), AIPerf
(its artifact folder, ``profile_export.jsonl``, ``profile_export_aiperf.json``), ``vllm bench serve
--save-result [--save-detailed]`` JSON and llm-d Benchmark Reports (v0.2, v0.2.1; JSON or YAML). Each becomes
one or more :class:`~kvbench.results.peers.common.PeerRun` (per request where the file has them, else
aggregates, said in its notes), normalised through the metric dictionary (:data:`kvbench.results.rows.METRICS`):
GuideLLM's TPOT includes TTFT (kvbench's NTPOT), AIPerf's ITL is vLLM's TPOT."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kvbench.errors import BadFile, ResultsError
from kvbench.results.peers import aiperf
from kvbench.results.peers.common import LATENCIES, PeerRun
from kvbench.results.peers.guidellm import is_guidellm, read_guidellm
from kvbench.results.peers.llmd import is_llmd_report, read_llmd
from kvbench.results.peers.vllm_bench import is_vllm_bench, read_vllm_bench
from kvbench.safe_read import MAX_RUN_JSON_BYTES, find_below, read_json_file, read_regular, too_deep
from kvbench.safe_text import visible
from kvbench.scenario.load import expanded_size

#: The tools whose files kvbench reads, as :attr:`PeerRun.tool` names them.
TOOLS = ("guidellm", "aiperf", "vllm bench serve", "llm-d report")
#: Values a YAML result may hold once its aliases (``*name``) are expanded: a "billion laughs" file of 400 bytes
#: expands to billions, which reading would walk.
MAX_YAML_VALUES = 5_000_000


def _parse(path: Path) -> object:
    """The JSON or YAML document in ``path`` (by its suffix; YAML loaded safely: no tags, no objects).

    Raises:
        ResultsError: not readable, too large, not UTF-8, not valid JSON/YAML, or nested too deeply.
    """
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            raw = read_regular(path, MAX_RUN_JSON_BYTES)
            if len(raw) > MAX_RUN_JSON_BYTES:
                raise BadFile(f"{path}: the file is over {MAX_RUN_JSON_BYTES:,} bytes")
            try:
                loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(raw.decode("utf-8-sig"))
                try:
                    node = loader.get_single_node()
                    if node is not None and expanded_size(node, {}) > MAX_YAML_VALUES:
                        raise BadFile(f"{path}: the file expands to more than {MAX_YAML_VALUES:,} values through its "
                                      "aliases (*name): not a result file")
                    data = loader.construct_document(node) if node is not None else None
                finally:
                    loader.dispose()
            except UnicodeDecodeError as exc:
                raise BadFile(f"{path}: not UTF-8 text (byte {exc.start})") from None
            except (yaml.YAMLError, RecursionError, ValueError) as exc:
                if isinstance(exc, BadFile):
                    raise
                raise BadFile(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
            if too_deep(data):
                raise BadFile(f"{path}: nested too deeply")
            return data
        return read_json_file(path)
    except BadFile as exc:
        raise ResultsError(str(exc)) from None


def _first_line(path: Path) -> object:
    try:
        with open(path, "rb") as f:
            line = f.readline(1 << 20)
        return json.loads(line.decode("utf-8-sig"))
    except (OSError, ValueError, RecursionError):
        return None


def peer_runs(path: str | Path) -> list[PeerRun] | None:
    """The runs in ``path`` when it is a peer tool's result file (or an AIPerf artifact folder); None when it is
    none of theirs (a kvbench run, or anything else).

    Raises:
        ResultsError: a peer file that cannot be read or is not of its tool's shape (naming the file and key).
    """
    p = Path(path)
    if p.is_dir():
        if (p / "trials.jsonl").exists():
            return None
        if (p / aiperf.RECORDS).is_file() or (p / aiperf.SUMMARY).is_file():
            return [aiperf.read_aiperf(p)]
        reports = sorted(f for f in p.iterdir() if f.suffix.lower() in (".json", ".yaml", ".yml") and f.is_file()
                         and not f.is_symlink())
        found = [peer_runs(f) for f in reports]
        if not any(runs and runs[0].tool == "llm-d report" for runs in found):
            return None
        foreign = [f.name for f, runs in zip(reports, found) if not (runs and runs[0].tool == "llm-d report")]
        if foreign:
            raise ResultsError(f"{p}: a folder of llm-d reports holds files that are none: {', '.join(foreign[:3])}"
                               + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""))
        runs = [run for runs in found for run in runs]  # a folder kvbench report --format llm-d wrote
        return sorted(runs, key=lambda r: not r.none_mode)  # `none` first: the reference
    if not p.is_file():
        return None
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return [aiperf.read_aiperf(p)] if aiperf.is_aiperf_record(_first_line(p)) else None
    if suffix not in (".json", ".yaml", ".yml"):
        return None
    data = _parse(p)
    if is_guidellm(data):
        return read_guidellm(p, data)
    if aiperf.is_aiperf_summary(data):
        return [aiperf.read_aiperf(p)]
    if is_vllm_bench(data):
        return [read_vllm_bench(p, data)]
    if is_llmd_report(data):
        return [read_llmd(p, data)]
    return None


def _llmd_version(path: str | Path) -> str:
    """The ``version`` of an llm-d report kvbench does not read (e.g. 0.1), else ``""``."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".json", ".yaml", ".yml"):
        return ""
    try:
        data = _parse(p)
    except ResultsError:
        return ""
    if isinstance(data, dict) and "run" in data and "results" in data and "version" in data:
        return str(data["version"])
    return ""


def peer_hint(path: str | Path) -> str:
    """What to say of a path a reader of kvbench runs was given: ``"; it is <tool>'s result: kvbench cost and
    kvbench map read it"`` when it is a peer tool's result file or folder, else ``""`` (also when it cannot be read)."""
    try:
        found = peer_runs(path)
    except ResultsError:
        return ""
    return f"; it is {found[0].tool}'s result: kvbench cost and kvbench map read it" if found else ""


def load_peers(paths: list[str | Path]) -> list[PeerRun]:
    """The runs of every path in ``paths``, in order (:func:`peer_runs`); runs whose labels would be the same
    are labelled by their whole path.

    Raises:
        ResultsError: a path that does not exist, one that is no result of GuideLLM, AIPerf, ``vllm bench serve``
            or an llm-d report (naming it and what kvbench reads), or one that cannot be read.
    """
    runs: list[PeerRun] = []
    for path in paths:
        found = peer_runs(path) if Path(path).exists() else None
        if found is None:
            raise _no_peer_file(path)
        runs += found
    distinct_labels(runs)
    return runs


def peer_files(paths: list[str | Path]) -> list[PeerRun] | None:
    """What kind of files ``paths`` are, for a command that reads both kinds (``kvbench cost``, ``kvbench map``):
    the runs of them all (as :func:`load_peers` labels them, each file read once) when one or more is another
    tool's result file; None when none is (kvbench runs, left to :func:`kvbench.results.load.load_results`).

    Raises:
        ResultsError: another tool's file beside a kvbench run (a run directory, a ``trials.jsonl``, a folder with
            runs below it): both kinds at once; beside another tool's file, a path that is neither (as
            :func:`load_peers` says it); a peer file that cannot be read.
        kvbench.errors.BadFile: a folder given holds folders nested deeper than kvbench searches.
    """
    found = [peer_runs(p) for p in paths]
    if all(f is None for f in found):
        return None
    for path, f in zip(paths, found):
        if f is None:
            if is_kvbench_run(path):
                raise ResultsError(f"give kvbench runs or other tools' result files, not both: {path} is a kvbench "
                                   "run")
            raise _no_peer_file(path)
    runs = [run for f in found for run in f or []]
    distinct_labels(runs)
    return runs


def is_kvbench_run(path: str | Path) -> bool:
    """Whether ``path`` is kvbench's: a run directory (it holds ``trials.jsonl``), a ``.jsonl`` file, or a folder
    with a ``trials.jsonl`` somewhere below it (searched to :data:`kvbench.safe_read.MAX_SEARCH_DEPTH`).

    Raises:
        kvbench.errors.BadFile: ``path`` holds folders nested deeper than that.
    """
    p = Path(path)
    return ((p / "trials.jsonl").exists() or (p.is_file() and p.suffix == ".jsonl")
            or (p.is_dir() and bool(find_below(p, "trials.jsonl"))))


def _no_peer_file(path: str | Path) -> ResultsError:
    """Why ``path`` is no result file of another tool: it does not exist, it is an llm-d report of a version
    kvbench does not read, or it is of no tool kvbench reads."""
    if not Path(path).exists():
        return ResultsError(f"{path}: no such file or directory")
    if version := _llmd_version(path):
        return ResultsError(f"{path}: an llm-d Benchmark Report of version {version}: kvbench reads versions 0.2 "
                            "and 0.2.1")
    return ResultsError(f"{path}: not a result file kvbench imports (GuideLLM JSON/YAML, AIPerf's "
                        "profile_export.jsonl or profile_export_aiperf.json, vllm bench serve JSON, llm-d Benchmark "
                        "Report)")


def distinct_labels(runs: list[PeerRun]) -> None:
    """Runs whose labels are the same get their whole path as label (the same file given twice: a note)."""
    seen: dict[str, list[PeerRun]] = {}
    for run in runs:
        seen.setdefault(run.label, []).append(run)
    for label, same in seen.items():
        if len(same) < 2:
            continue
        paths = [r.path.resolve() for r in same]
        for run in same:
            suffix = label[label.index(" ["):] if " [" in label else ""
            run.label = visible(f"{run.path}{suffix}")
            if paths.count(run.path.resolve()) > 1:
                run.notes.append(f"{run.path} was given more than once")


__all__ = ["LATENCIES", "PeerRun", "TOOLS", "distinct_labels", "is_kvbench_run", "load_peers", "peer_files",
           "peer_hint", "peer_runs"]
