"""The formats a layer's K or V history takes off the device: the host tier's, the disk tier's and the link's.

The device always holds K/V in the model's dtype; what leaves it is :meth:`HostFormat.encode`-d on the device
first (so the link moves the smaller form), stored as one or more parts (each ``[batch, kv_heads, n, *]``: the
tiers store any dtype), and :meth:`HostFormat.decode`-d on the device after the copy back. One format per K and
per V of a cache (``k_dtype``, ``v_dtype``: keys are the more sensitive, as KIVI and llama.cpp's measurements
show).

- ``model`` (the default): the model's dtype, unchanged: lossless.
- ``float32``, ``bfloat16``, ``float16``: a cast; lossless only when it is the model's dtype (or wider).
- ``int8``: symmetric, one float32 scale per token and head (``scale = max|x| / 127`` over ``head_dim``,
  ``q = round(x / scale)``): each element within ``scale / 2`` of its value. Per token and head rather than per
  channel or per group of tokens because the history grows a token at a time and each token is encoded once, when
  it leaves the device, with nothing to wait for (KIVI's per-channel keys need a group of tokens first; the
  Hadamard rotation below is the other answer to outlier channels). Bytes per token and head: ``head_dim + 4``.
- ``fp8``: ``float8_e4m3fn`` (3 mantissa bits, largest 448) with one float32 scale per token and head (``max|x| /
  448``): relative error at most 2⁻⁴ for normal values; stored as its bytes (``uint8``), since not every torch
  operation takes float8. ``head_dim + 4`` bytes per token and head.
- ``hadamard: true`` (with any format): ``x`` is rotated by the normalised Hadamard matrix ``H``
  (``head_dim × head_dim``, Sylvester's construction: ``head_dim`` a power of two) before it is encoded and rotated back
  (``H`` is its own inverse) after it is decoded, which spreads an outlier channel over all of them (QuaRot, llama.cpp's
  rotated q4_0 cache).
"""

from __future__ import annotations

import functools

import torch

from kvbench.offload.architecture import hadamard_fits

__all__ = ["Cast", "Fp8", "HOST_DTYPES", "Hadamard", "HostFormat", "Int8", "host_format", "hadamard_matrix"]

#: The host tier's formats by name, with what each keeps (``kvbench list modes`` and the mode options take these).
HOST_DTYPES = {
    "model": "the model's dtype: lossless",
    "float32": "float32 (lossless for float32, bfloat16 and float16 models)",
    "bfloat16": "bfloat16 (lossy for a float32 model)",
    "float16": "float16 (lossy for a float32 model)",
    "int8": "int8, one float32 scale per token and head (lossy)",
    "fp8": "float8 e4m3, one float32 scale per token and head (lossy)",
}

_CASTS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SCALE = torch.float32
_SCALE_BYTES = 4


class HostFormat:
    """How one of K or V is held off the device.

    Attributes:
        name: the format's name (see :data:`HOST_DTYPES`).
        parts: how many tensors :meth:`encode` gives.
    """

    name = "model"
    parts = 1

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x`` (``[batch, kv_heads, n, head_dim]``, on the device) as the tier stores it, on the same device."""
        return (x,)

    def decode(self, parts: tuple[torch.Tensor, ...] | list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The stored ``parts`` back as ``[batch, kv_heads, n, head_dim]`` in ``dtype``, on their device."""
        return parts[0] if parts[0].dtype == dtype else parts[0].to(dtype)

    def token_bytes(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one token of one sequence takes in this format, scales included (``dtype``: the model's)."""
        return kv_heads * head_dim * dtype.itemsize

    def lossless(self, dtype: torch.dtype) -> bool:
        """Whether decode(encode(x)) equals ``x`` for every ``x`` of the model's ``dtype``."""
        return True


class Cast(HostFormat):
    """A plain dtype (``float32``, ``bfloat16``, ``float16``)."""

    def __init__(self, name: str):
        self.name, self.dtype = name, _CASTS[name]

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x if x.dtype == self.dtype else x.to(self.dtype),)

    def token_bytes(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return kv_heads * head_dim * self.dtype.itemsize

    def lossless(self, dtype: torch.dtype) -> bool:
        return dtype == self.dtype or self.dtype == torch.float32 or (
            self.dtype == torch.float16 and dtype == torch.float16)


def _scales(x: torch.Tensor, top: float) -> torch.Tensor:
    """One float32 scale per token and head, ``max|x| / top`` over ``head_dim`` (1 where the row is all zeros)."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(_SCALE)
    return torch.where(amax > 0, amax / top, torch.ones_like(amax))


class Int8(HostFormat):
    """Symmetric int8, one float32 scale per token and head: parts ``(q int8 [b, h, n, d], scale float32 [b, h,
    n, 1])``; ``|x - decode(encode(x))| <= scale / 2 = max|x| / 254`` element by element."""

    name, parts = "int8", 2

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scale = _scales(x, 127.0)
        return torch.round(x.to(_SCALE) / scale).clamp_(-127, 127).to(torch.int8), scale

    def decode(self, parts, dtype):
        q, scale = parts
        return (q.to(_SCALE) * scale).to(dtype)

    def token_bytes(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return kv_heads * (head_dim + _SCALE_BYTES)

    def lossless(self, dtype: torch.dtype) -> bool:
        return False


class Fp8(HostFormat):
    """float8 e4m3 (``torch.float8_e4m3fn``), one float32 scale per token and head: parts ``(bytes uint8 [b, h, n,
    d], scale float32 [b, h, n, 1])``; relative error ≤ 2⁻⁴ for normal values, ≤ ``scale × 2⁻¹⁰`` absolute near 0.

    Raises:
        ValueError: this torch has no ``float8_e4m3fn``.
    """

    name, parts = "fp8", 2
    TOP = 448.0  # the largest finite e4m3fn

    def __init__(self):
        if not hasattr(torch, "float8_e4m3fn"):
            raise ValueError(f"host dtype fp8 needs torch.float8_e4m3fn, which torch {torch.__version__} lacks")

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scale = _scales(x, self.TOP)
        return (x.to(_SCALE) / scale).to(torch.float8_e4m3fn).view(torch.uint8), scale

    def decode(self, parts, dtype):
        q, scale = parts
        return (q.view(torch.float8_e4m3fn).to(_SCALE) * scale).to(dtype)

    def token_bytes(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return kv_heads * (head_dim + _SCALE_BYTES)

    def lossless(self, dtype: torch.dtype) -> bool:
        return False


@functools.lru_cache(maxsize=16)
def _hadamard(n: int, device: torch.device) -> torch.Tensor:
    h = torch.ones((1, 1), dtype=torch.float32)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n**0.5).to(device)


def hadamard_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The normalised ``n × n`` Hadamard matrix (Sylvester: symmetric, orthonormal, its own inverse), float32.

    Raises:
        ValueError: ``n`` is not a power of two.
    """
    if not hadamard_fits(n):
        raise ValueError(f"hadamard needs a head_dim that is a power of two, got {n}")
    return _hadamard(n, torch.device(device))


class Hadamard(HostFormat):
    """``inner`` applied to ``x @ H`` (``H``: :func:`hadamard_matrix` of ``head_dim``), rotated back on decode."""

    def __init__(self, inner: HostFormat):
        self.inner, self.name, self.parts = inner, f"{inner.name}+hadamard", inner.parts

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rotated = x.to(_SCALE) @ hadamard_matrix(x.shape[-1], x.device)
        return self.inner.encode(rotated if isinstance(self.inner, (Int8, Fp8)) else rotated.to(x.dtype))

    def decode(self, parts, dtype):
        x = self.inner.decode(parts, _SCALE)
        return (x @ hadamard_matrix(x.shape[-1], x.device)).to(dtype)

    def token_bytes(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return self.inner.token_bytes(kv_heads, head_dim, dtype)

    def lossless(self, dtype: torch.dtype) -> bool:
        return False  # the rotation's float32 round trip is not bit-exact


def host_format(name: str | None = None, hadamard: bool = False) -> HostFormat:
    """The format called ``name`` (None or ``model``: the model's dtype), rotated first with ``hadamard``.

    Raises:
        KeyError: an unknown name (the message lists :data:`HOST_DTYPES`). ValueError: see :class:`Fp8`.
    """
    name = name or "model"
    if name not in HOST_DTYPES:
        raise KeyError(f"unknown host dtype '{name}'; available: {', '.join(HOST_DTYPES)}")
    fmt = {"model": HostFormat, "int8": Int8, "fp8": Fp8}.get(name)
    base = fmt() if fmt is not None else Cast(name)
    return Hadamard(base) if hadamard else base
