"""Reading a scenario file: YAML within limits (size, aliases, depth; no duplicate keys), validated into a
:class:`~kvbench.scenario.schema.Scenario`, its paths taken from its directory, then checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvbench.arguments import path_arg
from kvbench.errors import ScenarioError
from kvbench.scenario import messages
from kvbench.scenario.checks import check_scenario
from kvbench.scenario.messages import echo
from kvbench.scenario.paths import resolve_paths
from kvbench.scenario.schema import Scenario

#: A scenario file larger than this (bytes) is refused before parsing.
MAX_YAML_BYTES = 1 << 20
#: Values a scenario may hold once its aliases (``*name``) are expanded; a "billion laughs" file of 1 KB expands
#: to billions, which validation would walk.
MAX_YAML_VALUES = 100_000
#: Deepest nesting of lists and mappings a scenario file may have.
MAX_YAML_DEPTH = 100


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
        raise ScenarioError(file, messages.problems(exc)) from None


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


def expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Values ``node`` stands for with every alias expanded, counted without expanding (memoised per node)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a recursive alias counts once instead of looping
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
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


#: The folder of the scenarios shipped with kvbench (beside the package, in a source checkout).
SHIPPED = Path(__file__).resolve().parent.parent.parent / "scenarios"


def shipped_hint(missing: Path) -> str:
    """For a scenario file that does not exist: the shipped scenario its name is closest to (did you mean, from the
    registry of ``scenarios/``), or ""."""
    from kvbench.offload.registry import Registry

    shipped = Registry("scenario", ((p.stem, p) for p in sorted(SHIPPED.glob("*.yaml")))) if SHIPPED.is_dir() else {}
    close = shipped.close(missing.stem) if shipped else []
    return f"did you mean {shipped[close[0]]}?" if close else ""


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
        why = str(exc).removeprefix(f"{file}: ")
        if not Path(file).exists():
            why += "; " + shipped_hint(Path(file))
        raise ScenarioError(file, [("", why.removesuffix("; "))]) from None
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
        if node is not None and expanded_size(node, {}) > MAX_YAML_VALUES:
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
        raise ScenarioError(file, [("", f"invalid YAML: a value kvbench cannot read ({echo(str(exc))[1:-1]})")]) \
            from None
    finally:
        loader.dispose()
    if data is None:
        raise ScenarioError(file, [("", "the file is empty; a scenario needs at least name, model, workload, "
                                        "prompt_tokens, max_new_tokens, batch_sizes and modes")])
    return data

def load_scenario(file: str | Path, *, check_model: bool = True) -> Scenario:
    """Read, validate and check a scenario file; relative paths inside it are taken from its directory.

    Raises:
        ScenarioError: every problem found, each with the file, key path, bad value and what is allowed.
        kvbench.errors.BadParameter: ``file`` is no path.
    """
    file = path_arg(file, "file")
    s = parse_scenario(read_yaml(file), file)
    s = resolve_paths(s, Path(file).resolve().parent)
    problems = check_scenario(s, check_model=check_model)
    if problems:
        raise ScenarioError(file, problems)
    return s
