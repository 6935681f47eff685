"""A KV store for reuse: the KV of finished requests kept in fixed-size token chunks, so that a request whose prompt
starts with a stored prefix (the next turn of a conversation, another question about the same document) restores
that prefix instead of recomputing it.

- A chunk holds the K and V of ``chunk_tokens`` consecutive tokens of one sequence, every layer:
  ``[layers, 2 (K, V), kv_heads, chunk_tokens, head_dim]``.
- Its key is a chained hash: key_i = BLAKE2b-128(key_{i−1} ‖ token ids of chunk i), key_{−1} = empty, so a key
  covers the whole prefix up to the end of its chunk (the scheme of vLLM's prefix caching and LMCache): the same
  tokens after a different prefix are a different chunk.
- Chunks live in host memory (capped by ``host_max_bytes``) and spill, least recently used first, to a disk tier
  (``disk_max_bytes``; files in a private directory, see :class:`~kvbench.offload.tiers.DiskTier`); beyond the
  disk cap the least recently used chunks are dropped. One recency order spans both tiers; every store or
  lookup touches a prefix's chunks last-to-first, so its first chunks are its most recently used and eviction
  shortens prefixes from their tails. Dropping a chunk also drops every chunk stored after it (unreachable
  without it), so no tail is ever kept behind a missing head.
- Every chunk file carries a checksum (BLAKE2b-256 of its payload). A missing, truncated or corrupt file is a miss
  (with a :class:`StoreWarning`), and the prefix ends before it: restored KV is never wrong, only shorter.

Sizes are bytes; one token of one sequence takes ``token_bytes`` = layers × 2 × kv_heads × head_dim × dtype bytes.
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
from typing import Any

import torch

from kvbench.offload.disk import drop_pages, sync_file
from kvbench.offload.tiers import DiskTier

#: First bytes of every chunk file.
MAGIC = b"KVBSTORE1\n"
_DIGEST = 32


class StoreWarning(UserWarning):
    """A stored chunk could not be used (missing, truncated or corrupt file): it counts as a miss."""


def chunk_keys(token_ids: Sequence[int], chunk_tokens: int) -> list[bytes]:
    """The chained keys of the whole chunks of ``token_ids`` (a trailing partial chunk has none): key i covers
    tokens ``[0, (i + 1) × chunk_tokens)``."""
    keys, prev = [], b""
    for start in range(0, len(token_ids) - chunk_tokens + 1, chunk_tokens):
        chunk = torch.tensor(token_ids[start:start + chunk_tokens], dtype=torch.int64).numpy().tobytes()
        prev = hashlib.blake2b(prev + chunk, digest_size=16).digest()
        keys.append(prev)
    return keys


@dataclass
class Prefix:
    """A restored prefix of one sequence.

    Attributes:
        tokens: how many tokens it covers (a multiple of ``chunk_tokens``; 0 on a miss).
        keys, values: per layer ``[kv_heads, tokens, head_dim]`` on the CPU (empty lists when ``tokens`` is 0).
        host_bytes, disk_bytes: bytes restored from each tier.
    """

    tokens: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    host_bytes: int = 0
    disk_bytes: int = 0


class KVStore:
    """KV chunks of finished requests, in host memory and on disk, keyed by chained token hashes, LRU-evicted.

    Args:
        chunk_tokens: tokens per chunk (default 256, as LMCache).
        host_max_bytes: host memory for chunks (bytes); at least one chunk.
        disk_max_bytes: disk space for chunks (bytes); 0 = no disk tier, else at least one chunk.
        disk_dir: where the disk tier makes its private directory (default: the system temporary directory).
        token_bytes: bytes of one token's KV (all layers, K and V) if known now, to check the caps at once;
            otherwise they are checked at the first :meth:`put`.
        page_cache: leave chunk files in the page cache (reads of "disk" chunks then come from RAM). Default
            False: each chunk file is synced to the device when written (``fdatasync``) and dropped from the page
            cache after it is written and after each read (``posix_fadvise(DONTNEED)``), as the disk tier does.

    Raises:
        ValueError: ``chunk_tokens`` below 1, a negative cap, or a cap smaller than one chunk.
        kvbench.offload.tiers.DiskTierError: the disk directory cannot be created.
    """

    def __init__(self, chunk_tokens: int = 256, host_max_bytes: int = 2**30, disk_max_bytes: int = 0,
                 disk_dir: str | Path | None = None, token_bytes: int | None = None, page_cache: bool = False):
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be at least 1, not {chunk_tokens}")
        if host_max_bytes < 0 or disk_max_bytes < 0:
            raise ValueError(f"byte caps cannot be negative (host_max_bytes {host_max_bytes}, "
                             f"disk_max_bytes {disk_max_bytes})")
        self.chunk_tokens = chunk_tokens
        self.host_max_bytes = host_max_bytes
        self.disk_max_bytes = disk_max_bytes
        self.chunk_bytes: int | None = None
        self._host: dict[bytes, torch.Tensor] = {}
        self._disk: dict[bytes, tuple[Path, int]] = {}  # key → (file, payload bytes)
        self._order: OrderedDict[bytes, None] = OrderedDict()  # every chunk, least recently used first
        self._children: dict[bytes, set[bytes]] = {}  # a chunk → the chunks whose prefix it ends
        self.host_bytes = 0
        self.disk_bytes = 0
        self.hits = self.misses = self.evicted = self.corrupt = 0
        self.tier = DiskTier(disk_dir) if disk_max_bytes else None
        self.page_cache = page_cache
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
        self._host.clear()
        self._disk.clear()
        self._order.clear()
        self._children.clear()
        self.host_bytes = self.disk_bytes = 0
        if self.tier is not None:
            self.tier.close()

    # ------------------------------------------------------------------ writing

    def put(self, token_ids: Sequence[int], keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> int:
        """Store the whole chunks of one sequence's KV; chunks already stored are only touched.

        Args:
            token_ids: the sequence's tokens whose KV is given (prompt and generated tokens fed to the model).
            keys, values: per layer ``[kv_heads, tokens, head_dim]`` (any device; copied to the CPU), with
                ``tokens ≥ len(token_ids)``: position j holds token j's K and V.

        Returns:
            The number of new chunks stored.

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
        chunk_keys_ = chunk_keys(token_ids, self.chunk_tokens)
        if not chunk_keys_:
            return 0
        per_chunk = len(keys) * 2 * shape[0] * self.chunk_tokens * shape[2] * keys[0].element_size()
        if self.chunk_bytes is None:
            self._check_caps(per_chunk)
        elif per_chunk != self.chunk_bytes:
            raise ValueError(f"this store holds chunks of {self.chunk_bytes:,} bytes, not {per_chunk:,}: one "
                             "model and dtype per store")
        new = 0
        for i, key in enumerate(chunk_keys_):
            if key in self._order:
                continue
            span = slice(i * self.chunk_tokens, (i + 1) * self.chunk_tokens)
            block = torch.stack([torch.stack([k[:, span], v[:, span]]) for k, v in zip(keys, values)])
            self._host[key] = block.to("cpu", copy=True).contiguous()
            self._order[key] = None
            if i:
                self._children.setdefault(chunk_keys_[i - 1], set()).add(key)
            self.host_bytes += per_chunk
            new += 1
        self._touch(chunk_keys_)
        self._evict()
        return new

    def _drop(self, key: bytes) -> None:
        """Forget a chunk (deleting its file) and every chunk after it in any stored sequence: without it they
        can never be reached, so keeping them would only waste space."""
        stack = [key]
        while stack:
            k = stack.pop()
            if k not in self._order:
                continue
            del self._order[k]
            if k in self._host:
                self.host_bytes -= self._host.pop(k).nbytes
            else:
                path, nbytes = self._disk.pop(k)
                path.unlink(missing_ok=True)
                self.disk_bytes -= nbytes
            self.evicted += 1
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
            self.host_bytes -= block.nbytes
            try:
                self._write(key, block)
            except OSError as exc:  # e.g. the disk is full: the chunk is dropped, a later request recomputes it
                warnings.warn(f"KV store: cannot write a chunk to {self.tier.path} ({exc.strerror or exc}); "
                              "dropped", StoreWarning, stacklevel=3)
                self._host[key] = block  # back in place for _drop's accounting
                self.host_bytes += block.nbytes
                self._drop(key)
            while self.disk_bytes > self.disk_max_bytes:  # at once: the disk never holds more than one extra chunk
                self._drop(self._least_recent(self._disk))

    def _write(self, key: bytes, block: torch.Tensor) -> None:
        """Write a chunk file: magic, checksum, header length, header (dtype, shape), payload."""
        payload = block.view(-1).view(torch.uint8).numpy().tobytes()
        header = json.dumps({"dtype": str(block.dtype).removeprefix("torch."), "shape": list(block.shape)}).encode()
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

    # ------------------------------------------------------------------ reading

    def _touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):  # the first chunk of a prefix ends up most recently used
            if key in self._order:
                self._order.move_to_end(key)

    def _read(self, key: bytes) -> torch.Tensor | None:
        """A disk chunk, or None (with a warning, the entry forgotten) when its file is missing or damaged."""
        path, nbytes = self._disk[key]
        try:
            with path.open("rb") as f:
                data = f.read()
                if not self.page_cache:
                    drop_pages(f.fileno())
            if not data.startswith(MAGIC):
                raise ValueError("not a kvbench store chunk")
            at = len(MAGIC)
            digest, at = data[at:at + _DIGEST], at + _DIGEST
            n = int.from_bytes(data[at:at + 4], "little")
            header = json.loads(data[at + 4:at + 4 + n])
            payload = data[at + 4 + n:]
            if len(payload) != nbytes:
                raise ValueError(f"truncated: {len(payload)} of {nbytes} bytes")
            if hashlib.blake2b(payload, digest_size=_DIGEST).digest() != digest:
                raise ValueError("checksum mismatch")
            dtype = getattr(torch, header["dtype"])
            return torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype).reshape(header["shape"])
        except (OSError, ValueError, KeyError, AttributeError, RuntimeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            warnings.warn(f"KV store chunk {path.name} unusable ({why}): counted as a miss", StoreWarning,
                          stacklevel=3)
            self.evicted -= 1  # _drop counts it; it was damaged, not evicted
            self._drop(key)
            self.corrupt += 1
            return None

    def lookup(self, token_ids: Sequence[int]) -> int:
        """Tokens of the longest stored prefix of ``token_ids`` in whole chunks (files are not read or checked)."""
        n = 0
        for key in chunk_keys(token_ids, self.chunk_tokens):
            if key not in self._order:
                break
            n += self.chunk_tokens
        return n

    def get(self, token_ids: Sequence[int], max_tokens: int | None = None) -> Prefix:
        """Restore the longest stored prefix of ``token_ids`` in whole chunks, at most ``max_tokens`` tokens
        (e.g. the prompt less one token, whose forward must give the next token's logits).

        Disk chunks are read and checked; the prefix ends at the first missing or damaged one. Counts
        :attr:`hits` and :attr:`misses` per chunk looked up (a miss ends the lookup).
        """
        limit = len(token_ids) if max_tokens is None else min(len(token_ids), max_tokens)
        keys = chunk_keys(token_ids[:limit], self.chunk_tokens)
        blocks: list[torch.Tensor] = []
        host = disk = 0
        for key in keys:
            if key in self._host:
                block = self._host[key]
                host += block.nbytes
            elif key in self._disk and (block := self._read(key)) is not None:
                disk += block.nbytes
            else:
                self.misses += 1
                break
            blocks.append(block)
            self.hits += 1
        self._touch(keys[:len(blocks)])
        if not blocks:
            return Prefix(0, [], [])
        whole = torch.cat(blocks, dim=3)  # [layers, 2, kv_heads, tokens, head_dim]
        return Prefix(whole.shape[3], list(whole[:, 0]), list(whole[:, 1]), host, disk)


# --------------------------------------------------------------------------- caches ↔ store


def sequence_kv(cache: Any, row: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """K and V of every token a cache holds for batch row ``row``, per layer ``[kv_heads, tokens, head_dim]`` on
    the CPU (all tiers of kvbench's offload caches: disk, host, then the device window), ready for
    :meth:`KVStore.put`.

    Raises:
        ValueError: an empty cache, or a sliding-window layer (it keeps only its last tokens: its KV cannot be
            restored for a longer prompt).
    """
    from kvbench.offload.layers import OffloadedLayer

    keys, values = [], []
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "sliding_window", None):
            raise ValueError(f"layer {i} is a sliding-window layer: its KV cannot be stored for reuse")
        if not getattr(layer, "is_initialized", False):
            raise ValueError(f"layer {i} holds no KV")
        k, v = layer.keys[row].cpu(), layer.values[row].cpu()
        if isinstance(layer, OffloadedLayer) and layer.keys_history.length:
            k = torch.cat([layer.keys_history.view(layer.engine)[row].cpu(), k], dim=-2)
            v = torch.cat([layer.values_history.view(layer.engine)[row].cpu(), v], dim=-2)
        keys.append(k)
        values.append(v)
    return keys, values


def restore(cache: Any, prefix: Prefix, device: Any, dtype: torch.dtype | None = None) -> None:
    """Load a restored prefix into an empty cache of any mode, batch 1, through the cache's own ``update`` — the
    path a prefill's K/V take — so each mode places it in its tiers (``none``: the device; ``full``,
    ``hierarchical``, ``dynamic``: their windows, host and disk). Then prefill only the tokens after
    ``prefix.tokens``, at positions ``prefix.tokens`` onwards.

    Raises:
        ValueError: the cache already holds tokens, or the prefix has another number of layers.
    """
    if cache.get_seq_length() != 0:
        raise ValueError(f"restore needs an empty cache (it holds {cache.get_seq_length()} tokens)")
    if prefix.tokens == 0:
        return
    if len(prefix.keys) != len(cache.layers):
        raise ValueError(f"the prefix has {len(prefix.keys)} layers, the cache {len(cache.layers)}")
    for i, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
        cache.update(k[None].to(device, dtype), v[None].to(device, dtype), i)


__all__ = ["KVStore", "MAGIC", "Prefix", "StoreWarning", "chunk_keys", "restore", "sequence_kv"]
