"""What a server configuration holds beside the device (kvbench.bench.engines.server.tiers): the host tier its flags
configure, per engine, and the bytes of its slot files."""

from __future__ import annotations

import pytest

from kvbench.bench.engines.server.tiers import files_bytes, host_tier
from kvbench.serving.kind import last_value


@pytest.mark.parametrize("kind, argv, expected", [
    ("llama.cpp", ["-m", "x.gguf", "--cache-ram", "0", "--cache-ram", "256"], (256 * 2**20, "--cache-ram 256 MiB")),
    ("llama.cpp", ["-m", "x.gguf", "-cram=64"], (64 * 2**20, "--cache-ram 64 MiB")),
    ("llama.cpp", ["-m", "x.gguf"], (8192 * 2**20, "--cache-ram 8192 MiB (llama-server's default)")),
    ("llama.cpp", ["--cache-ram", "0"], (0, "--cache-ram 0: no host tier")),
    ("llama.cpp", ["--cache-ram", "-1"], (None, "--cache-ram -1: no limit, the size is not known from the flags")),
    ("llama.cpp", ["--cache-ram", "abc"],
     (None, "--cache-ram abc: not a number of MiB, the size is not known from the flags")),
    ("vllm", ["m", "--enable-prefix-caching"], (0, "no --kv-offloading-size: no host tier")),
    ("vllm", ["m", "--kv-offloading-backend", "native", "--kv-offloading-size", "8"],
     (8 * 2**30, "--kv-offloading-size 8 GiB")),
    ("vllm", ["m", "--kv-transfer-config", "{}"],
     (None, "a KV connector (--kv-transfer-config): its host size is in its own configuration")),
    ("sglang", ["--model-path", "m"], (0, "no --enable-hierarchical-cache: no host tier")),
    ("sglang", ["--enable-hierarchical-cache", "--hicache-size", "50"], (50 * 10**9, "--hicache-size 50 GB")),
    ("sglang", ["--enable-hierarchical-cache", "--hicache-ratio", "2"],
     (None, "--hicache-ratio 2: a multiple of the device pool, not known from the flags")),
    ("openai", None, (None, "a server kvbench did not start: its host tier is not known")),
])
def test_the_host_tier_is_read_from_the_last_flag_as_each_engine_reads_it(kind, argv, expected):
    assert host_tier(kind, argv) == expected


def test_last_value_takes_both_spellings_and_the_last_occurrence():
    assert last_value(["--a", "1", "--a=2", "--b", "3"], ["--a"]) == "2"
    assert last_value(["--a"], ["--a"]) is None and last_value([], ["--a"]) is None


def test_slot_files_count_their_own_bytes_and_never_follow_a_link(tmp_path):
    (tmp_path / "c0.bin").write_bytes(b"x" * 100)
    (tmp_path / "big").write_bytes(b"x" * 10_000)
    (tmp_path / "c1.bin").symlink_to(tmp_path / "big")
    assert files_bytes(tmp_path, ["c0.bin", "c0.bin", "missing.bin"]) == 100
    assert files_bytes(tmp_path, ["c1.bin"]) == len(str(tmp_path / "big"))  # the link itself, not its target
    assert files_bytes(None, ["c0.bin"]) == 0
