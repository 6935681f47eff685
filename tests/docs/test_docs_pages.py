"""The README and every page of docs/ keep their promises: every ```yaml block validates with the code `kvbench
validate` runs (load_scenario), every command line in a ```console block names a real command whose flags parse,
every ```python block compiles, every pasted output says the commit and machine that printed it, every page is in
the MkDocs navigation, and the README stays short (≤ 300 lines).

A YAML block with a top-level ``name`` is a whole scenario; any other block is a fragment, checked inside the
scenario page's first whole scenario (its keys replace that scenario's; a reuse workload drops prompt_tokens and
batch_sizes, which it does not take); a workload fragment that offers multi_turn ``# or`` doc_qa ``# or``
shared_prefix is checked once with each.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main
import yaml

from conftest import ROOT
from kvbench.cli import app
from kvbench.scenario import load_scenario
from kvbench.scenario.workload import REUSE_KINDS

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", flags=re.S | re.M)


def blocks(kind: str) -> list[tuple[str, int, str]]:
    """(page, line, body) of every fenced block of ``kind`` (yaml, console, python) in the README and docs/."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) == kind:
                out.append((str(page.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(2)))
    return out


YAML = blocks("yaml")
CONSOLE = blocks("console")
PYTHON = blocks("python")
BASE = next(yaml.safe_load(b) for page, _, b in YAML if page == "docs/scenarios.md" and "name" in yaml.safe_load(b))


def _scenarios(block: dict) -> list[dict]:
    """The whole scenarios a YAML block stands for."""
    if "name" in block:
        return [block]
    data = {**BASE, **block}
    wl = data["workload"]
    offered = [k for k in REUSE_KINDS if k in wl]
    if offered:
        data = {k: v for k, v in data.items() if k not in ("prompt_tokens", "batch_sizes")}
        return [{**data, "workload": {k: v for k, v in wl.items() if k not in offered or k == keep}}
                for keep in offered]
    return [data]


def test_the_pages_have_yaml_blocks_and_the_base_is_the_dialogue_scenario():
    assert len(YAML) >= 8 and BASE["name"] == "dialogue"
    assert {page for page, _, _ in YAML} >= {"README.md", "docs/scenarios.md", "docs/engines.md"}


@pytest.mark.parametrize("page,line,body", YAML, ids=[f"{p}:{n}" for p, n, _ in YAML])
def test_every_yaml_block_validates(page, line, body, tmp_path):
    for n, data in enumerate(_scenarios(yaml.safe_load(body))):
        path = tmp_path / f"block{n}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        load_scenario(path)  # raises ScenarioError naming the key that fails


# ---- command lines ------------------------------------------------------------------------------------------------

#: Programs a docs command may run besides kvbench, make, python and bash scripts of this repository.
OTHER_PROGRAMS = {"llama-server", "time", "ray", "kubectl", "curl", "vllm", "guidellm", "aiperf", "pip", "git",
                  "apt-get", "ls", "cat", "wc", "head", "nvidia-smi", "source", "mkdocs"}


def command_lines(body: str) -> list[str]:
    """The command lines of a console block: its ``$ `` lines when it has any (the rest is their output), else every
    line that is not a comment; a trailing ``\\`` joins the next line; ``# comments`` are dropped."""
    lines = body.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    out, cont = [], ""
    for line in lines:
        if cont:
            line, cont = cont + " " + line.strip(), ""
        elif prompted:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        line = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            cont = line[:-1].rstrip()
            continue
        if line.strip():
            out.append(line.strip())
    return out


def simple_commands(line: str) -> list[list[str]]:
    """A shell line split into its simple commands (on ``&&``, ``||``, ``;`` and ``|``), each as words, with a
    leading ``time`` and ``NAME=value`` assignments dropped."""
    words = shlex.split(line, comments=True)
    out, cur = [], []
    for w in words + [";"]:
        if w in ("&&", "||", ";", "|"):
            while cur and (cur[0] == "time" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", cur[0])):
                cur.pop(0)
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out


CLI = typer.main.get_command(app)


def parse_kvbench(args: list[str]) -> None:
    """Parse ``kvbench ARGS`` as the CLI would, without running it: an unknown command or option, a missing
    argument or a value of the wrong type raises the CLI's UsageError (Typer's click), an unknown command
    AssertionError."""
    cmd, ctx = CLI, CLI.make_context("kvbench", ["list"])  # a context to look commands up in; nothing runs
    while hasattr(cmd, "get_command"):  # a group: kvbench itself, `kvbench models`
        assert args, "no command"
        name, args = args[0], args[1:]
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"no such command {name!r}"
        cmd = sub
    cmd.make_context(cmd.name, list(args), parent=ctx)


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))


def check_command(words: list[str]) -> None:
    program = Path(words[0]).name
    repo_files = [w for w in words[1:] if re.match(r"(scenarios|tests|benchmarks|scripts)/", w) and "*" not in w]
    missing = [w for w in repo_files if not (ROOT / w).exists()]
    assert not missing, f"{missing}: not in the repository"
    if program == "kvbench":
        parse_kvbench(words[1:])
    elif program == "make":
        missing = set(words[1:]) - make_targets()
        assert not missing, f"no make target {sorted(missing)}"
    elif program in ("python", "python3", "bash"):
        script = ROOT / words[1]
        assert script.is_file(), f"{words[1]}: no such file in the repository"
        source = script.read_text()
        unknown = [w.split("=")[0] for w in words[2:] if w.startswith("--") and w.split("=")[0] not in source]
        assert not unknown, f"{words[1]} takes no {unknown}"
    else:
        assert program in OTHER_PROGRAMS, f"{program}: not a command the docs may use (add it to OTHER_PROGRAMS)"


COMMANDS = [(page, line, cmd) for page, line, body in CONSOLE for cmd in command_lines(body)]


def test_the_console_blocks_hold_commands_of_every_kind():
    programs = {Path(simple_commands(c)[0][0]).name for _, _, c in COMMANDS}
    assert {"kvbench", "make", "python", "llama-server"} <= programs
    assert len(COMMANDS) >= 30


@pytest.mark.parametrize("page,line,command", COMMANDS, ids=[f"{p}:{n}:{c[:40]}" for p, n, c in COMMANDS])
def test_every_command_line_parses(page, line, command):
    for words in simple_commands(command):
        check_command(words)


@pytest.mark.parametrize("words,error", [
    (["kvbench", "runn", "x.yaml"], "no such command 'runn'"),
    (["kvbench", "cost", "--gpu-prise", "2"], "No such option: --gpu-prise"),
    (["kvbench", "cost", "--gpu-price", "two"], "Input should be a valid number"),
    (["kvbench", "compare", "a"], "Missing parameter: run_b"),
    (["make", "demo-gpu"], "no make target ['demo-gpu']"),
    (["python", "benchmarks/nothing.py"], "['benchmarks/nothing.py']: not in the repository"),
    (["python", "benchmarks/offload_overhead.py", "--no-such-flag"], "takes no ['--no-such-flag']"),
    (["rm", "-rf", "/"], "rm: not a command the docs may use"),
    (["kvbench", "run", "scenarios/nothing.yaml"], "['scenarios/nothing.yaml']: not in the repository"),
])
def test_the_command_check_refuses_what_does_not_exist(words, error):
    with pytest.raises(Exception, match=re.escape(error)):
        check_command(words)


def test_command_lines_join_continuations_and_drop_comments_and_output():
    body = "$ kvbench run a.yaml \\\n    --out /tmp/x   # where\nresults: /tmp/x\n$ make demo\n"
    assert command_lines(body) == ["kvbench run a.yaml --out /tmp/x", "make demo"]
    assert command_lines("make quick   # first\n             # more\nmake test\n") == ["make quick", "make test"]
    assert simple_commands("time kvbench run a.yaml && kvbench map results/b-*") == [
        ["kvbench", "run", "a.yaml"], ["kvbench", "map", "results/b-*"]]


# ---- python, outputs, navigation, README length -------------------------------------------------------------------

@pytest.mark.parametrize("page,line,body", PYTHON, ids=[f"{p}:{n}" for p, n, _ in PYTHON])
def test_every_python_block_compiles(page, line, body):
    compile(body, f"{page}:{line}", "exec")


PROVENANCE = re.compile(r"commit `[0-9a-f]{7,40}`")


@pytest.mark.parametrize("page,line,body", [b for b in CONSOLE if re.search(r"^\$ ", b[2], flags=re.M)],
                         ids=[f"{p}:{n}" for p, n, b in CONSOLE if re.search(r"^\$ ", b, flags=re.M)])
def test_every_pasted_output_says_its_commit_and_machine(page, line, body):
    before = (ROOT / page).read_text(encoding="utf-8").splitlines()[max(0, line - 4):line - 1]
    said = [s for s in before if PROVENANCE.search(s) and "machine" in s]
    assert said, f"{page}:{line}: say which commit and machine printed this output, just above the block"


def test_every_docs_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert {p for p in pages if p not in nav} == set()


def test_the_readme_is_short_and_links_into_the_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)", text))
    assert {"docs/getting-started.md", "docs/engines.md", "docs/troubleshooting.md"} <= linked
    assert all((ROOT / p).is_file() for p in linked), linked


def test_the_readme_shows_the_quick_scenario_as_it_is():
    shown = next(yaml.safe_load(b) for page, _, b in YAML if page == "README.md" and "name: quick" in b)
    assert shown == yaml.safe_load((ROOT / "scenarios" / "quick.yaml").read_text())
