"""The errors kvbench raises on purpose, in one hierarchy.

Every error a user can cause (a file, a value, a model, a directory, a machine that cannot do what was asked)
is a :class:`UserError`: its message is one or more complete lines that name the file, the key path or the value
and what is allowed, and never a flag (only ``kvbench.cli`` knows flag names). ``kvbench.cli`` maps a
:class:`UserError` to exit status 2; anything else that escapes is a bug, shown as a traceback with "please
report". Each class also derives from the builtin a caller would expect (``ValueError``, ``LookupError``,
``OSError``) so that ``except ValueError`` keeps working.

The offload engine (:mod:`kvbench.offload`) imports nothing else of kvbench; its two errors,
:class:`~kvbench.offload.modes.ModeUnavailable` (a trial is ``skipped``) and
:class:`~kvbench.offload.disk.DiskTierError` (a trial is an ``error``), are caught by the sweep and recorded.
"""

from __future__ import annotations

from pathlib import Path


class KvbenchError(Exception):
    """The root of every error kvbench raises on purpose."""


class UserError(KvbenchError):
    """Input or circumstances the user can change: the CLI prints the message and exits with status 2."""


class BadValue(UserError, ValueError):
    """An argument out of its allowed range (a price, a size, a count); the message names the value and the
    range, never the flag that carried it."""


class BadFile(UserError, ValueError):
    """A file that cannot be read as what kvbench expects there; the message names the file."""


class ScenarioError(UserError, ValueError):
    """A scenario file that cannot be run. ``problems`` holds one ``(key path, message)`` per fault."""

    def __init__(self, file: str | Path, problems: list[tuple[str, str]]):
        self.file = str(file)
        self.problems = problems
        lines = [f"{self.file}: {path}: {msg}" if path else f"{self.file}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))


class WorkloadError(UserError, ValueError):
    """A workload's source cannot give what the scenario asks for."""


class NotEnoughRequests(WorkloadError):
    """The source holds fewer conversations or documents than the workload asks for (the message says how many
    qualified and why others did not)."""


class TooLittleText(WorkloadError):
    """The source has too few texts long enough for a prompt length."""


class TooManyFiles(WorkloadError):
    """A glob that matches more than :data:`kvbench.scenario.paths.MAX_MATCHES` paths."""


class NoFilesError(UserError, FileNotFoundError):
    """A glob that matches no readable text file."""


class ModelNotFound(UserError, LookupError):
    """A model name that is no local directory, GGUF file, alias or cached hub id."""


class ModelLoadError(UserError, ValueError):
    """The model could not be loaded; the message is one line: the model (its name or path), the cause's type
    and the first line of its message."""


class RemoteCodeRefused(UserError, ValueError):
    """A scenario asks for the model's own code (``model.trust_remote_code: true``) without the run allowing it."""


class ServerConfigRefused(UserError, ValueError):
    """A server scenario that would have kvbench run another program than the engine's own, or server flags that
    read or write files, fetch weights or code, run code or reach another machine, without the run allowing it
    (``kvbench run --trust-server-config``). ``needs``: the ``(key path, reason)`` pairs."""

    def __init__(self, where: str | Path, needs: list[tuple[str, str]]):
        self.needs = needs
        lines = "; ".join(f"{path}: {why}" for path, why in needs)
        super().__init__(f"{where}: {lines}")


class RunDirError(UserError, ValueError):
    """A run directory that cannot be opened or resumed (missing files, other schema version)."""


class SymlinkRefused(RunDirError):
    """A file or directory kvbench would write, truncate or lock is a symbolic link it did not make (e.g. a run
    directory unpacked from someone's tarball): writing through it would change the link's target."""

    def __init__(self, path: str | Path):
        super().__init__(f"{path} is a symbolic link: kvbench writes, truncates and locks only files it made; "
                         "remove the link (or copy what it points to in its place)")
        self.path = Path(path)


class NotRegular(RunDirError):
    """A file kvbench would write, truncate or lock is a directory, a FIFO or a device (not a file it made)."""

    def __init__(self, path: str | Path):
        super().__init__(f"{path}: not a regular file: kvbench writes, truncates and locks only files it made; "
                         "move it away")
        self.path = Path(path)


class ForeignRow(RunDirError):
    """A row of ``trials.jsonl`` written under another scenario than the run's ``run.json``."""


class RecordError(UserError, ValueError):
    """A ``run.json`` or trial row that does not hold what kvbench writes: the message names the file (and line),
    the key path and what is allowed. ``path`` is the file, ``line`` the row's line (None for run.json), ``key``
    the key path."""

    def __init__(self, path: str | Path, line: int | None, key: str, why: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {key}: {why}" if key else f"{where}: {why}")
        self.path, self.line, self.key = Path(path), line, key


class ResultsError(UserError, ValueError):
    """Results that cannot be loaded: a missing path, nothing to load, an unknown schema version, a run.json or
    trial row that does not hold what kvbench writes (naming the file, the line and the key)."""


class NvmlUnavailable(KvbenchError, RuntimeError):
    """NVML cannot be used (no library, no driver, no such device); the samplers record ``None`` instead."""


class BadParameter(BadValue):
    """An argument of a library function out of its allowed range (or missing its partner). ``params`` are the
    names of the arguments the message speaks of, ``param`` the first (the one at fault); ``template`` is the
    message with each of them written ``{name}``: ``str()`` reads the argument names there, :meth:`worded` the
    caller's own names for them (``kvbench.cli``: its flags). Other text, braces included, is left as it is."""

    def __init__(self, template: str, *params: str):
        self.template, self.params, self.param = template, params, params[0]
        super().__init__(self.worded({}))

    def worded(self, names: dict[str, str]) -> str:
        """The message with each ``{argument}`` of :attr:`params` replaced by ``names[argument]`` (by the
        argument's own name where ``names`` has none)."""
        text = self.template
        for p in self.params:
            text = text.replace(f"{{{p}}}", names.get(p, p))
        return text


class UnwritableOutput(UserError, OSError):
    """Output kvbench was asked to write cannot be written (no such directory, a directory in its place, a full
    disk, no permission): ``cannot write [<what> to ]<path>: <reason>``. ``path`` is the file or directory,
    ``reason`` the system's words (e.g. ``Is a directory``), ``what`` what was being written (may be empty)."""

    def __init__(self, path: str | Path, reason: str, what: str = ""):
        super().__init__(f"cannot write {f'{what} to ' if what else ''}{path}: {reason}")
        self.path, self.reason, self.what = Path(path), reason, what


class PrepareError(UserError, RuntimeError):
    """A run that cannot start: its device, model, workload or stores cannot be prepared, or the preflight found
    trials that cannot be built; the message names the scenario file (or the run's run.json)."""


class RunStopped(UserError, OSError):
    """A run stopped because its results could not be written (disk full, quota, a removed directory).
    ``reason`` says what happened and what run.json says; ``kept`` is how many finished trials the run keeps;
    ``path`` is its directory, None when it was removed (it had been made by this run and no trial had
    finished)."""

    def __init__(self, reason: str, kept: int, path: Path | None):
        super().__init__(f"{reason}; no trial had finished: nothing was kept" if path is None
                         else f"{reason}; {kept} finished trials are kept in {path}")
        self.reason, self.kept, self.path = reason, kept, path


class ClusterError(UserError, RuntimeError):
    """The cluster a run asks for cannot be used: Ray is not installed (the ``kvbench[ray]`` extra), its address
    cannot be reached, no node satisfies a placement, or no worker could start; the message says which and
    what the cluster has. Raised before any trial runs."""


class SweepIncomplete(UserError, RuntimeError):
    """A sweep ended before every trial ran because the executor lost its workers for good (a cluster's
    nodes went away); the trials that finished are kept and ``--resume`` runs the rest."""
