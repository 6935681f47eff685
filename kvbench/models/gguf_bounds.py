"""A GGUF file's header checked against the file's own size before ``gguf.GGUFReader`` reads it: the reader
trusts every count (an array claiming 2^40 elements in a 68-byte file kept it appending empty reads past 8 GB),
so each count and length here must fit in the bytes that are left.

The layout is GGUF's (``ggml/docs/gguf.md``, versions 2 and 3): ``GGUF``, version (uint32), tensor count and
metadata count (uint64 each), then per metadata entry a key (uint64 length, bytes), a value type (uint32) and the
value: fixed-size scalars, a string (uint64 length, bytes), or an array (element type uint32, count uint64, the
elements); little-endian, or big-endian where the version reads so.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from kvbench.errors import BadFile

#: Bytes of each fixed-size GGUF value type (uint8, int8, uint16, int16, uint32, int32, float32, bool, -, -,
#: uint64, int64, float64); 8 is a string, 9 an array.
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
#: The fewest bytes a tensor's description takes (a name's length, 1 dimension, its size, type and offset).
_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8
#: Deepest arrays of arrays read.
_MAX_NESTING = 8
#: The most strings and arrays that arrays of a header may hold together: gguf's reader keeps about 1.6 KB of
#: numpy views per such element (an 8 MB file of 1,000,000 empty strings took it to 1.64 GB). Llama 3's header
#: holds 408,403 (128,256 tokens and 280,147 merges); numbers in arrays count as one array each.
MAX_ARRAY_ITEMS = 1 << 20
#: The GGUF versions gguf's reader takes.
_VERSIONS = (2, 3)


class _Header:
    def __init__(self, data: mmap.mmap | bytes, path: Path):
        self.data, self.path, self.pos, self.order, self.items = data, path, 0, "<", 0

    def refuse(self, what: str) -> BadFile:
        return BadFile(f"{self.path}: not a GGUF header kvbench can read: {what}")

    def fail(self, what: str) -> BadFile:
        return self.refuse(f"{what} at byte {self.pos:,}, past the file's {len(self.data):,} bytes")

    def take(self, n: int, what: str) -> int:
        if n > len(self.data) - self.pos:
            raise self.fail(what)
        start, self.pos = self.pos, self.pos + n
        return start

    def number(self, fmt: str, what: str) -> int:
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(self.order + fmt, self.data, start)[0]

    def value(self, kind: int, depth: int = 0) -> None:
        if kind in _SIZES:
            self.take(_SIZES[kind], "a value")
        elif kind == _STRING:
            self.take(self.number("Q", "a string's length"), "a string")
        elif kind == _ARRAY and depth < _MAX_NESTING:
            inner, count = self.number("I", "an array's type"), self.number("Q", "an array's length")
            least = _SIZES.get(inner, 8 if inner in (_STRING, _ARRAY) else 0)
            if least == 0:
                raise self.refuse(f"value type {inner} at byte {self.pos:,}")
            if count * least > len(self.data) - self.pos:
                raise self.fail(f"an array of {count:,} elements")
            if inner in _SIZES:
                self.take(count * least, "an array")
            else:
                self.items += count
                if self.items > MAX_ARRAY_ITEMS:
                    raise self.refuse(f"its arrays hold more than {MAX_ARRAY_ITEMS:,} strings and arrays (at byte "
                                      f"{self.pos:,}; a model's vocabulary and merges hold some 400,000)")
                for _ in range(count):
                    self.value(inner, depth + 1)
        else:
            what = f"arrays nested more than {_MAX_NESTING} deep" if kind == _ARRAY else f"value type {kind}"
            raise self.refuse(f"{what} at byte {self.pos:,}")


def check_gguf_header(path: str | Path) -> None:
    """Refuse a GGUF file whose header claims more than the file holds or more than :data:`MAX_ARRAY_ITEMS`
    strings and arrays in its arrays: every key, string and array must fit in the bytes left, and the tensor count
    in what is left after the metadata; ``general.architecture`` must be a string. Reads through a memory map (the
    weights are never read). A file too short for the fixed header, or not starting with ``GGUF``, is left to the
    reader to refuse.

    Raises:
        BadFile: ``<path>: not a GGUF header kvbench can read: <what> at byte N, past the file's M bytes``, a
            version other than 2 or 3, a value type GGUF does not have, too many array items, or an architecture
            that is not a string.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:4] != b"GGUF":
                return
            h = _Header(data, path)
            h.pos = 4
            version = h.number("I", "the version")
            if version not in _VERSIONS and (version >> 24) in _VERSIONS and not version & 0xFFFFFF:
                h.order, version = ">", version >> 24  # a big-endian file's version reads as N << 24
            if version not in _VERSIONS:
                raise h.refuse(f"GGUF version {version} (gguf reads {' and '.join(map(str, _VERSIONS))})")
            tensors, entries = h.number("Q", "the tensor count"), h.number("Q", "the metadata count")
            if entries * (8 + 4) > size - h.pos:
                raise h.fail(f"{entries:,} metadata entries")
            for _ in range(entries):
                key = bytes(data[h.take(h.number("Q", "a key's length"), "a key"):h.pos])
                kind = h.number("I", "a value type")
                if key == b"general.architecture" and kind != _STRING:
                    raise h.refuse(f"general.architecture is of value type {kind}, not a string")
                h.value(kind)
            if tensors * _TENSOR_INFO_BYTES > size - h.pos:
                raise h.fail(f"{tensors:,} tensors")


__all__ = ["check_gguf_header"]
