"""The keys kvbench gives a server it starts (:class:`~kvbench.serving.kind.PrivateKeys`): fresh random ones per
server, in a file only kvbench's user can read, present while the server runs, so that no other process of
the machine can use its endpoints."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvbench.errors import UnwritableOutput
from kvbench.serving.kind import PrivateKeys


@dataclass(frozen=True)
class ServerKeys:
    """One server's keys and the file that gives them.

    Attributes:
        path: the file (in the run's ``servers`` folder; a random name, made by kvbench).
        settings: setting name → key (URL-safe text, 256 random bits each).
        text: what the file holds (as :attr:`~kvbench.serving.kind.PrivateKeys.file_format` says).
        argv: the words that name the file to the server (appended to its command line).
        headers: the HTTP headers kvbench's requests send (``Authorization: Bearer <request key>``).
    """

    path: Path
    settings: dict[str, str]
    text: str
    argv: tuple[str, ...]
    headers: dict[str, str]


def server_keys(keys: PrivateKeys | None, folder: Path, stem: str) -> ServerKeys | None:
    """Fresh keys for one server of a kind that checks ``keys`` (None: it checks none), their file named
    ``<stem>.<random>.yaml`` (``.keys`` for keys one per line) in ``folder``; nothing is written yet
    (:func:`keys_file`)."""
    if keys is None:
        return None
    settings = {name: secrets.token_urlsafe(32) for name in (keys.request_key, *keys.admin_keys)}
    path = folder / f"{stem}.{secrets.token_hex(8)}.{'yaml' if keys.file_format == 'yaml' else 'keys'}"
    text = (yaml.safe_dump(settings) if keys.file_format == "yaml" else "".join(f"{k}\n" for k in settings.values()))
    return ServerKeys(path, settings, text, (keys.config_flag, str(path)),
                      {"Authorization": f"Bearer {settings[keys.request_key]}"})


def sweep_keys(folder: Path, labels: Iterable[str]) -> list[Path]:
    """Remove the key files a killed kvbench left in ``folder`` (a run's ``servers``; ``kill -9`` skips every exit
    path): named as :func:`server_keys` names them for one of the run's mode ``labels``
    (``<label>-r<repeat>.<16 hex digits>.yaml`` or ``.keys``), regular files of kvbench's user, mode 0600, with no
    other link; symbolic links and everything else are left. Their servers are gone with kvbench, so the keys open
    nothing; they are removed all the same. Returns the files removed."""
    names = re.compile("(" + "|".join(map(re.escape, labels)) + r")-r\d+\.[0-9a-f]{16}\.(yaml|keys)")
    gone = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for e in entries:
            if not names.fullmatch(e.name) or not e.is_file(follow_symlinks=False):
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid() and st.st_nlink == 1:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    gone.append(Path(e.path))
    return gone


@contextlib.contextmanager
def keys_file(keys: ServerKeys | None) -> Iterator[None]:
    """Write ``keys``' file for the length of the ``with`` block (nothing for None): created anew (never
    through an existing name or a symbolic link) with mode 0600, removed on every exit path.

    Raises:
        kvbench.errors.UnwritableOutput: the file cannot be created (a name that exists, a full disk, no
            permission).
    """
    if keys is None:
        yield
        return
    try:
        fd = os.open(keys.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise UnwritableOutput(keys.path, e.strerror or str(e)) from None
    try:
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(keys.text)
        except OSError as e:
            raise UnwritableOutput(keys.path, e.strerror or str(e)) from None
        yield
    finally:
        keys.path.unlink(missing_ok=True)
