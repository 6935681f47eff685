"""A KV store for reuse: the KV of finished requests kept in token chunks, so that a request whose prompt starts
with a stored prefix (a conversation's next turn, another question about a document) restores it, not recomputes it.

- A chunk holds the K and V of consecutive tokens of one sequence, every layer, in the store's host formats
  (:mod:`kvbench.offload.host_tiers`; the model's dtype by default): K's parts then V's, each ``[layers, kv_heads,
  tokens, *]`` (``head_dim``, or 1 for a scale). A sequence is cut into whole chunks of ``chunk_tokens`` and (``tails``,
  the default) one shorter **tail** chunk of the tokens after them, so a conversation's next turn restores the whole
  previous turn.
- Keys are chained hashes: whole chunk i's is BLAKE2b-128(key_{i−1} ‖ its token ids), key_{−1} = empty, covering
  the whole prefix up to its end (as vLLM's prefix caching and LMCache); a tail's is the same hash after the key
  before it, personalised (:func:`tail_key`), so it never equals a whole chunk's. A lookup takes whole chunks while
  they match, then the longest stored tail the prompt goes on with. Storing a sequence that extends a stored tail
  (its tokens, then more) drops that tail: the new chunks hold its KV, and nothing is held twice.
- Chunks live in host memory (``host_max_bytes``) and spill, least recently used first, to a disk tier
  (``disk_max_bytes``; a private directory, see :class:`~kvbench.offload.tiers.DiskTier`); beyond the disk cap the
  least recently used are dropped. One recency order spans both tiers; a store or lookup touches a prefix's chunks
  last-to-first (its tail first), so eviction shortens prefixes from their ends. Dropping a chunk drops every chunk
  stored after it (unreachable without it): no tail is ever kept behind a missing head.
- Every chunk file carries a checksum (BLAKE2b-256 of its payload). A missing, truncated or corrupt file is a miss
  (with a :class:`StoreWarning`), and the prefix ends before it: restored KV is never wrong, only shorter.

Sizes are bytes as held (physical: the formats' parts, scales included); in the model's dtype one token of one
sequence takes layers × 2 × kv_heads × head_dim × dtype bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kvbench.offload.disk import drop_pages, sync_file
from kvbench.offload.host_tiers import HostFormat
from kvbench.offload.tiers import DiskTier

#: First bytes of every chunk file.
MAGIC = b"KVBSTORE1\n"
_DIGEST = 32
_TAIL = b"kvbench-tail"  # BLAKE2b personalisation of tail keys


class StoreWarning(UserWarning):
    """A stored chunk could not be used (missing, truncated or corrupt file): it counts as a miss."""


def _ids(token_ids: Sequence[int]) -> bytes:
    return torch.tensor(list(token_ids), dtype=torch.int64).numpy().tobytes()


def chunk_keys(token_ids: Sequence[int], chunk_tokens: int) -> list[bytes]:
    """The chained keys of the whole chunks of ``token_ids`` (a trailing partial chunk has none here, see
    :func:`tail_key`): key i covers tokens ``[0, (i + 1) × chunk_tokens)``."""
    keys, prev = [], b""
    for start in range(0, len(token_ids) - chunk_tokens + 1, chunk_tokens):
        prev = hashlib.blake2b(prev + _ids(token_ids[start:start + chunk_tokens]), digest_size=16).digest()
        keys.append(prev)
    return keys


def tail_key(prev: bytes, token_ids: Sequence[int]) -> bytes:
    """The key of a tail chunk holding ``token_ids`` (fewer than ``chunk_tokens``) after the whole chunk whose key
    is ``prev`` (``b""``: at the start of the sequence): BLAKE2b-128(prev ‖ ids), personalised."""
    return hashlib.blake2b(prev + _ids(token_ids), digest_size=16, person=_TAIL).digest()


@dataclass
class Prefix:
    """A restored prefix of one sequence.

    Attributes:
        tokens: how many tokens it covers (whole chunks, then ``tail_tokens``; 0 on a miss).
        keys, values: per layer ``[kv_heads, tokens, head_dim]`` on the CPU (empty lists when ``tokens`` is 0).
        host_bytes, disk_bytes: bytes restored from each tier.
        tail_tokens: tokens of the tail chunk at its end (0 to ``chunk_tokens − 1``).
    """

    tokens: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    host_bytes: int = 0
    disk_bytes: int = 0
    tail_tokens: int = 0


def _encoded(fmt: HostFormat, layers: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Every layer's ``[kv_heads, tokens, head_dim]`` in ``fmt``, each part stacked over layers and on the CPU:
    ``[layers, kv_heads, tokens, *]``."""
    encoded = [fmt.encode(x[None]) for x in layers]
    return tuple(torch.cat(part).to("cpu", copy=True).contiguous() for part in zip(*encoded))


def _nbytes(block: tuple[torch.Tensor, ...]) -> int:
    return sum(p.nbytes for p in block)


class KVStore:
    """KV chunks of finished requests, in host memory and on disk, keyed by chained token hashes, LRU-evicted.

    Args:
        chunk_tokens: tokens per whole chunk (default 256, as LMCache).
        host_max_bytes: host memory for chunks (bytes); at least one whole chunk.
        disk_max_bytes: disk space for chunks (bytes); 0 = no disk tier, else at least one whole chunk.
        disk_dir: where the disk tier makes its private directory (default: the system temporary directory).
        token_bytes: bytes of one token's KV (all layers, K and V) if known now, to check the caps at once;
            otherwise they are checked at the first :meth:`put`.
        page_cache: leave chunk files in the page cache (reads of "disk" chunks then come from RAM). Default
            False: each chunk file is synced to the device when written (``fdatasync``) and dropped from the page
            cache after it is written and after each read (``posix_fadvise(DONTNEED)``), as the disk tier does.
        tails: also store the tokens after a sequence's last whole chunk as a shorter tail chunk (default True);
            False keeps whole chunks only.
        formats: (K's, V's) :class:`~kvbench.offload.host_tiers.HostFormat` the chunks are held in, on the host and
            on disk (default: the model's dtype); :meth:`get` decodes them to the dtype :meth:`put` was given.

    Raises:
        ValueError: ``chunk_tokens`` below 1, a negative cap, or a cap smaller than one chunk.
        kvbench.offload.tiers.DiskTierError: the disk directory cannot be created.
    """

    def __init__(self, chunk_tokens: int = 256, host_max_bytes: int = 2**30, disk_max_bytes: int = 0,
                 disk_dir: str | Path | None = None, token_bytes: int | None = None, page_cache: bool = False,
                 tails: bool = True, formats: tuple[HostFormat, HostFormat] | None = None):
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
        if host_max_bytes < 0 or disk_max_bytes < 0:
            raise ValueError(f"byte caps cannot be negative (host_max_bytes {host_max_bytes}, "
                             f"disk_max_bytes {disk_max_bytes})")
        self.chunk_tokens, self.tails, self.page_cache = chunk_tokens, tails, page_cache
        self.host_max_bytes, self.disk_max_bytes = host_max_bytes, disk_max_bytes
        self.chunk_bytes: int | None = None
        self.formats = formats or (HostFormat(), HostFormat())
        self.dtype: torch.dtype | None = None  # the K/V dtype of the first put: what get decodes to
        self._host: dict[bytes, tuple[torch.Tensor, ...]] = {}
        self._disk: dict[bytes, tuple[Path, int]] = {}  # key → (file, payload bytes)
        self._order: OrderedDict[bytes, None] = OrderedDict()  # every chunk, least recently used first
        self._children: dict[bytes, set[bytes]] = {}  # a chunk → the chunks whose prefix it ends
        self._tails: dict[bytes, dict[bytes, int]] = {}  # the key before tails (b"": none) → {tail key: tokens}
        self._tail_of: dict[bytes, bytes] = {}  # a tail key → the key before it
        self.host_bytes = self.disk_bytes = 0
        self.hits = self.misses = self.evicted = self.corrupt = self.superseded = 0
        self.tier = DiskTier(disk_dir) if disk_max_bytes else None
        if token_bytes is not None:
            self._check_caps(token_bytes * chunk_tokens)

    def _check_caps(self, chunk_bytes: int) -> None:
        for name, cap in (("host_max_bytes", self.host_max_bytes), ("disk_max_bytes", self.disk_max_bytes)):
            if (cap or name == "host_max_bytes") and cap < chunk_bytes:
                raise ValueError(f"{name} {cap:,} is smaller than one chunk: {self.chunk_tokens} tokens × "
                                 f"{chunk_bytes // self.chunk_tokens:,} bytes = {chunk_bytes:,} bytes")
        self.chunk_bytes = chunk_bytes

    def __len__(self) -> int:
        return len(self._host) + len(self._disk)

    def close(self) -> None:
        """Drop every chunk and remove the disk directory (idempotent)."""
        for d in (self._host, self._disk, self._order, self._children, self._tails, self._tail_of):
            d.clear()
        self.host_bytes = self.disk_bytes = 0
        if self.tier is not None:
            self.tier.close()

    def put(self, token_ids: Sequence[int], keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> int:
        """Store one sequence's KV: its whole chunks and (``tails``) the tail after them; chunks already stored
        are only touched, tails the new chunks extend are dropped.

        Args:
            token_ids: the sequence's tokens whose KV is given (prompt and generated tokens fed to the model).
            keys, values: per layer ``[kv_heads, tokens, head_dim]`` (any device; copied to the CPU), with
                ``tokens ≥ len(token_ids)``: position j holds token j's K and V.

        Returns:
            The number of new chunks stored (a tail counts as one).

        Raises:
            ValueError: layers with different shapes, fewer positions than tokens, or caps smaller than a chunk.
        """
        if len(keys) != len(values) or not keys:
            raise ValueError(f"need K and V for every layer (got {len(keys)} K, {len(values)} V)")
        shape = keys[0].shape
        if any(t.shape != shape for t in (*keys, *values)) or len(shape) != 3:
            raise ValueError("every layer's K and V must be [kv_heads, tokens, head_dim] of one shape")
        if shape[1] < len(token_ids):
            raise ValueError(f"{len(token_ids)} tokens but K/V for only {shape[1]} positions")
        c = self.chunk_tokens
        whole = chunk_keys(token_ids, c)
        at = len(whole) * c  # where the tail starts
        spans = [(k, i * c, c) for i, k in enumerate(whole)]  # (key, first token, tokens)
        if self.tails and at < len(token_ids):
            spans.append((tail_key(whole[-1] if whole else b"", token_ids[at:]), at, len(token_ids) - at))
        if not spans:
            return 0
        kf, vf = self.formats
        token_bytes = len(keys) * (kf.token_bytes(shape[0], shape[2], keys[0].dtype)
                                   + vf.token_bytes(shape[0], shape[2], keys[0].dtype))
        if self.dtype is None:
            self.dtype = keys[0].dtype
        elif keys[0].dtype != self.dtype:
            raise ValueError(f"this store holds {self.dtype} K/V, not {keys[0].dtype}: one model and dtype per store")
        if self.chunk_bytes is None:
            self._check_caps(token_bytes * c)
        elif token_bytes * c != self.chunk_bytes:
            raise ValueError(f"this store holds chunks of {self.chunk_bytes:,} bytes, not {token_bytes * c:,}: one "
                             "model and dtype per store")
        self._drop_superseded(token_ids, whole)
        new = 0
        for i, (key, start, n) in enumerate(spans):
            if key in self._order:
                continue
            span = slice(start, start + n)
            self._host[key] = (*_encoded(kf, [k[:, span] for k in keys]), *_encoded(vf, [v[:, span] for v in values]))
            self._order[key] = None
            parent = whole[i - 1] if i else b""
            if i:
                self._children.setdefault(parent, set()).add(key)
            if n < c:
                self._tails.setdefault(parent, {})[key] = n
                self._tail_of[key] = parent
            self.host_bytes += token_bytes * n
            new += 1
        self._touch([k for k, _, _ in spans])
        self._evict()
        return new

    def _drop_superseded(self, token_ids: Sequence[int], whole: list[bytes]) -> None:
        """Drop the stored tails that ``token_ids`` extends: after the same whole chunks, the same tokens, then
        more of this sequence (a whole chunk, or a longer tail, about to be stored)."""
        if not self.tails:
            return
        for i, parent in enumerate([b"", *whole]):
            start = i * self.chunk_tokens
            cover = self.chunk_tokens if i < len(whole) else len(token_ids) - start
            for key, n in list(self._tails.get(parent, {}).items()):
                if n < cover and tail_key(parent, token_ids[start:start + n]) == key:
                    self._drop(key, evicted=False)
                    self.superseded += 1

    def _drop(self, key: bytes, evicted: bool = True) -> None:
        """Forget a chunk (deleting its file) and every chunk after it in any stored sequence: without it they
        can never be reached, so keeping them would only waste space. ``evicted``: count them as evicted."""
        stack = [key]
        while stack:
            k = stack.pop()
            if k not in self._order:
                continue
            del self._order[k]
            if k in self._host:
                self.host_bytes -= _nbytes(self._host.pop(k))
            else:
                path, nbytes = self._disk.pop(k)
                path.unlink(missing_ok=True)
                self.disk_bytes -= nbytes
            if k in self._tail_of:
                parent = self._tail_of.pop(k)
                del self._tails[parent][k]
                self._children.get(parent, set()).discard(k)
                if not self._tails[parent]:
                    del self._tails[parent]
            self.evicted += evicted
            stack.extend(self._children.pop(k, ()))

    def _least_recent(self, tier: dict) -> bytes:
        return next(k for k in self._order if k in tier)

    def _evict(self) -> None:
        """Beyond the host cap, spill the least recently used host chunks to disk (or drop them without one);
        beyond the disk cap, drop the least recently used disk chunks. One recency order spans both tiers, and
        a prefix's first chunks are its most recent, so prefixes shorten from their tails."""
        while self.host_bytes > self.host_max_bytes:
            key = self._least_recent(self._host)
            if self.tier is None:
                self._drop(key)
                continue
            block = self._host.pop(key)
            self.host_bytes -= _nbytes(block)
            try:
                self._write(key, block)
            except OSError as exc:  # e.g. the disk is full: the chunk is dropped, a later request recomputes it
                warnings.warn(f"KV store: cannot write a chunk to {self.tier.path} ({exc.strerror or exc}); "
                              "dropped", StoreWarning, stacklevel=3)
                self._host[key] = block  # back in place for _drop's accounting
                self.host_bytes += _nbytes(block)
                self._drop(key)
            while self.disk_bytes > self.disk_max_bytes:  # at once: the disk never holds more than one extra chunk
                self._drop(self._least_recent(self._disk))

    def _write(self, key: bytes, block: tuple[torch.Tensor, ...]) -> None:
        """Write a chunk file: magic, checksum, header length, header (each part's dtype and shape), payload (the
        parts' bytes one after another)."""
        payload = b"".join(p.contiguous().view(-1).view(torch.uint8).numpy().tobytes() for p in block)
        header = json.dumps([{"dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape)}
                             for p in block]).encode()
        path = self.tier.path / f"{key.hex()}.kv"
        tmp = path.with_suffix(".tmp")
        try:
            with tmp.open("wb") as f:
                f.write(MAGIC + hashlib.blake2b(payload, digest_size=_DIGEST).digest()
                        + len(header).to_bytes(4, "little") + header + payload)
                if not self.page_cache:  # on the device, not in RAM: the next read of it is a device read
                    f.flush()
                    sync_file(f.fileno())
                    drop_pages(f.fileno())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        self._disk[key] = (path, len(payload))
        self.disk_bytes += len(payload)

    def _touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):  # the first chunk of a prefix ends up most recently used
            if key in self._order:
                self._order.move_to_end(key)

    def _read(self, key: bytes) -> tuple[torch.Tensor, ...] | None:
        """A disk chunk, or None (with a warning, the entry forgotten) when its file is missing or damaged."""
        path, nbytes = self._disk[key]
        try:
            with path.open("rb") as f:
                data = f.read()
                if not self.page_cache:
                    drop_pages(f.fileno())
            if not data.startswith(MAGIC):
                raise ValueError("not a kvbench store chunk")
            digest, at = data[len(MAGIC):len(MAGIC) + _DIGEST], len(MAGIC) + _DIGEST
            n = int.from_bytes(data[at:at + 4], "little")
            header = json.loads(data[at + 4:at + 4 + n])
            payload = data[at + 4 + n:]
            if len(payload) != nbytes:
                raise ValueError(f"truncated: {len(payload)} of {nbytes} bytes")
            if hashlib.blake2b(payload, digest_size=_DIGEST).digest() != digest:
                raise ValueError("checksum mismatch")
            flat, parts, at = torch.frombuffer(bytearray(payload), dtype=torch.uint8), [], 0
            for part in header:
                dtype = getattr(torch, part["dtype"])
                size = dtype.itemsize * int(torch.Size(part["shape"]).numel())
                parts.append(flat[at:at + size].view(dtype).reshape(part["shape"]))
                at += size
            if at != len(payload) or len(parts) != self.formats[0].parts + self.formats[1].parts:
                raise ValueError("its parts do not fill its payload")
            return tuple(parts)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            warnings.warn(f"KV store chunk {path.name} unusable ({why}): counted as a miss", StoreWarning,
                          stacklevel=3)
            self.evicted -= 1  # _drop counts it; it was damaged, not evicted
            self._drop(key)
            self.corrupt += 1
            return None

    def _tails_after(self, token_ids: Sequence[int], parent: bytes, start: int,
                     limit: int) -> list[tuple[bytes, int]]:
        """The stored tails ``token_ids`` continues with after the whole chunk ``parent`` (``b""``: none), which
        ends at token ``start``, and that end by token ``limit``: (key, tokens), longest first."""
        stored = self._tails.get(parent, {})
        keys = [(tail_key(parent, token_ids[start:start + n]), n) for n in sorted(set(stored.values()), reverse=True)
                if start + n <= limit]
        return [(k, n) for k, n in keys if k in stored]

    def lookup(self, token_ids: Sequence[int]) -> int:
        """Tokens of the longest stored prefix of ``token_ids``: whole chunks, then the longest tail after them
        (files are not read or checked)."""
        whole = chunk_keys(token_ids, self.chunk_tokens)
        n = next((i for i, k in enumerate(whole) if k not in self._order), len(whole))
        tails = self._tails_after(token_ids, whole[n - 1] if n else b"", n * self.chunk_tokens, len(token_ids))
        return n * self.chunk_tokens + (tails[0][1] if tails else 0)

    def get(self, token_ids: Sequence[int], max_tokens: int | None = None) -> Prefix:
        """Restore the longest stored prefix of ``token_ids``, whole chunks then a tail, at most ``max_tokens``
        tokens (e.g. the prompt less one token, whose forward must give the next token's logits).

        Disk chunks are read and checked; the whole chunks end at the first missing or damaged one, and the
        longest stored tail after them is added (a damaged tail: the next shorter one). Counts :attr:`hits` per
        chunk restored and :attr:`misses` per lookup whose whole chunks ended at a chunk not restored.
        """
        limit = len(token_ids) if max_tokens is None else min(len(token_ids), max_tokens)
        whole = chunk_keys(token_ids[:limit], self.chunk_tokens)
        blocks, used, sizes = [], [], {"host": 0, "disk": 0}

        def take(key: bytes) -> bool:
            if key in self._host:
                block, tier = self._host[key], "host"
            elif key in self._disk and (block := self._read(key)) is not None:
                tier = "disk"
            else:
                return False
            sizes[tier] += _nbytes(block)
            blocks.append(block)
            used.append(key)
            self.hits += 1
            return True

        n = next((i for i, key in enumerate(whole) if not take(key)), len(whole))
        self.misses += n < len(whole)
        start = n * self.chunk_tokens
        tail = next((t for key, t in self._tails_after(token_ids, used[-1] if n else b"", start, limit)
                     if take(key)), 0)
        self._touch(used)
        if not blocks:
            return Prefix(0, [], [])
        parts = [torch.cat(p, dim=2) for p in zip(*blocks)]  # each [layers, kv_heads, tokens, *]
        kf, vf = self.formats
        k = kf.decode(parts[:kf.parts], self.dtype)  # layers stand in for the batch: [layers, kv_heads, n, head_dim]
        v = vf.decode(parts[kf.parts:], self.dtype)
        return Prefix(k.shape[2], list(k), list(v), sizes["host"], sizes["disk"], tail)


__all__ = ["KVStore", "MAGIC", "Prefix", "StoreWarning", "chunk_keys", "tail_key"]
