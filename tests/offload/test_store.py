"""The reuse KV store: chained chunk keys, exact round trips through host and disk, tail chunks, LRU, damaged
files."""

from __future__ import annotations

import pytest
import torch

from kvbench.offload.store import KVStore, StoreWarning, chunk_keys, tail_key
from kvbench.offload.tiers import DiskTierError

LAYERS, HEADS, DIM, CHUNK = 3, 2, 4, 8
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 4  # float32: 192 bytes per token
CHUNK_BYTES = TOKEN_BYTES * CHUNK  # 1536


def kv(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(HEADS, n, DIM, generator=g) for _ in range(LAYERS)]
    values = [torch.randn(HEADS, n, DIM, generator=g) for _ in range(LAYERS)]
    return keys, values


def test_chunk_keys_are_chained_over_the_whole_prefix():
    a = chunk_keys(list(range(20)), CHUNK)
    assert len(a) == 2  # 20 tokens: two whole chunks, the last 4 tokens have no key
    assert chunk_keys(list(range(16)), CHUNK) == a
    b = chunk_keys([99] + list(range(1, 20)), CHUNK)
    assert b[0] != a[0] and b[1] != a[1]  # same second chunk after another first one: another key


def test_round_trip_is_exact_and_uses_whole_chunks_only():
    store = KVStore(CHUNK, host_max_bytes=10 * CHUNK_BYTES, tails=False)
    tokens = list(range(100, 123))  # 23 tokens: 2 whole chunks
    keys, values = kv(23)
    assert store.put(tokens, keys, values) == 2 and len(store) == 2
    assert store.put(tokens, keys, values) == 0  # already there
    assert store.host_bytes == 2 * CHUNK_BYTES
    # a new request sharing 20 tokens (inside the third chunk) restores the 2 whole chunks: 16 tokens
    p = store.get(tokens[:20] + [1, 2, 3])
    assert p.tokens == 16 and p.host_bytes == 2 * CHUNK_BYTES and p.disk_bytes == 0
    for layer in range(LAYERS):
        assert torch.equal(p.keys[layer], keys[layer][:, :16]) and torch.equal(p.values[layer], values[layer][:, :16])
    assert store.get(tokens, max_tokens=15).tokens == 8  # the prompt less one token, in whole chunks
    assert store.get([5] + tokens[1:]).tokens == 0  # first token differs: every key differs
    assert store.lookup(tokens) == 16 and store.hits == 3 and store.misses == 1


def test_a_tail_chunk_restores_the_tokens_after_the_last_whole_chunk():
    store = KVStore(CHUNK, host_max_bytes=10 * CHUNK_BYTES)
    tokens = list(range(100, 123))  # 23 tokens: 2 whole chunks and a tail of 7
    keys, values = kv(23)
    assert store.put(tokens, keys, values) == 3 and len(store) == 3
    assert store.host_bytes == 23 * TOKEN_BYTES  # the tail holds its 7 tokens, not a whole chunk's 8
    # the next turn: all 23 tokens and 4 new ones; the prompt less one token still covers the tail
    p = store.get(tokens + [1, 2, 3, 4], max_tokens=26)
    assert (p.tokens, p.tail_tokens, p.host_bytes) == (23, 7, 23 * TOKEN_BYTES)
    for layer in range(LAYERS):
        assert torch.equal(p.keys[layer], keys[layer]) and torch.equal(p.values[layer], values[layer])
    assert store.hits == 3 and store.misses == 1  # the third whole chunk (tokens 16-23 + 1) was not stored
    assert store.get(tokens, max_tokens=22).tokens == 16  # the tail would end past the limit
    assert store.get(tokens[:20] + [7, 7, 7, 7]).tokens == 16  # diverges inside the tail: whole chunks only
    assert store.lookup(tokens + [9]) == 23 and store.lookup(tokens[:22]) == 16
    # a sequence shorter than one chunk is a tail with nothing before it
    assert store.put([5, 6, 7], *kv(3, 1)) == 1 and store.lookup([5, 6, 7, 8]) == 3
    assert store.get([5, 6, 7, 8]).tail_tokens == 3
    # a tail's key is personalised: never a whole chunk's key, even over the same bytes
    assert tail_key(b"", tokens[:8]) != chunk_keys(tokens[:8], CHUNK)[0]
    assert tail_key(b"", [1, 2]) != tail_key(chunk_keys(tokens, CHUNK)[0], [1, 2])


def test_a_tail_the_next_sequence_extends_is_dropped_not_kept_twice():
    store = KVStore(CHUNK, host_max_bytes=10 * CHUNK_BYTES)
    turn1 = list(range(100, 123))  # 2 whole chunks + tail 16..23
    keys, values = kv(30)
    store.put(turn1, [k[:, :23] for k in keys], [v[:, :23] for v in values])
    other = turn1[:20] + [1, 2, 3]  # shares 20 tokens: does not extend the tail
    store.put(other, *kv(23, 1))
    assert len(store) == 4 and store.superseded == 0 and store.lookup(turn1 + [0]) == 23
    turn2 = turn1 + [7, 8, 9, 10, 11, 12, 13]  # 30 tokens: a third whole chunk 16..24 + a tail 24..30
    assert store.put(turn2, keys, values) == 2
    assert store.superseded == 1 and store.evicted == 0 and len(store) == 5  # turn 1's tail is gone
    assert store.host_bytes == (30 + 7) * TOKEN_BYTES  # turn 2's 30 tokens and other's tail 16..23
    p = store.get(turn2 + [0])
    assert (p.tokens, p.tail_tokens) == (30, 6) and torch.equal(p.values[2], values[2])
    assert store.lookup(turn1 + [0]) == 16  # turn 1 alone now restores its whole chunks only
    assert store.lookup(other + [0]) == 23  # other's tail was not extended: kept


def test_tails_are_evicted_first_spill_to_disk_and_fail_safe(tmp_path):
    tail_bytes = 4 * TOKEN_BYTES
    store = KVStore(CHUNK, host_max_bytes=3 * CHUNK_BYTES + tail_bytes)
    long = list(range(3 * CHUNK + 4))  # 3 whole chunks + a tail of 4: exactly the cap
    store.put(long, *kv(3 * CHUNK + 4))
    assert store.host_bytes == store.host_max_bytes and store.lookup(long + [0]) == 28
    store.put(list(range(500, 504)), *kv(4, 1))  # another 4-token tail: the least recent goes, long's tail
    assert store.lookup(long + [0]) == 3 * CHUNK and store.evicted == 1 and store.lookup(list(range(500, 505))) == 4
    # on disk: the tail spills with the rest, comes back exact; a damaged tail leaves the whole chunks
    store = KVStore(CHUNK, host_max_bytes=CHUNK_BYTES, disk_max_bytes=10 * CHUNK_BYTES, disk_dir=tmp_path)
    keys, values = kv(2 * CHUNK + 5)
    seq = list(range(2 * CHUNK + 5))
    store.put(seq, keys, values)
    tail = tail_key(chunk_keys(seq, CHUNK)[1], seq[16:])
    assert tail in store._disk and store.disk_bytes == (CHUNK + 5) * TOKEN_BYTES
    p = store.get(seq + [0])
    assert (p.tokens, p.tail_tokens, p.disk_bytes) == (21, 5, (CHUNK + 5) * TOKEN_BYTES)
    assert torch.equal(p.keys[0], keys[0]) and torch.equal(p.values[2], values[2])
    path = store._disk[tail][0]
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.warns(StoreWarning, match="truncated"):
        p = store.get(seq + [0])
    assert (p.tokens, p.tail_tokens) == (16, 0) and store.corrupt == 1 and store.lookup(seq + [0]) == 16
    store.close()


def test_lru_spills_to_disk_exactly_then_drops(tmp_path):
    store = KVStore(CHUNK, host_max_bytes=2 * CHUNK_BYTES, disk_max_bytes=2 * CHUNK_BYTES, disk_dir=tmp_path)
    seqs = [[s * 1000 + i for i in range(CHUNK)] for s in range(5)]
    data = [kv(CHUNK, seed=s) for s in range(5)]
    for s in range(3):
        store.put(seqs[s], *data[s])
    assert store.host_bytes == 2 * CHUNK_BYTES and store.disk_bytes == CHUNK_BYTES  # seq 0 spilled
    assert len(list(store.tier.path.glob("*.kv"))) == 1 and store.tier.path.stat().st_mode & 0o777 == 0o700
    p = store.get(seqs[0])
    assert p.tokens == CHUNK and p.disk_bytes == CHUNK_BYTES and p.host_bytes == 0
    assert torch.equal(p.keys[2], data[0][0][2]) and torch.equal(p.values[0], data[0][1][0])
    store.put(seqs[3], *data[3])
    # host spills 1 then 2 to disk; the disk holds 2 chunks, so the least recently used of 0, 1, 2 goes: 1
    # (0 was read after 1 was stored; a disk hit stays on disk)
    store.put(seqs[4], *data[4])
    assert store.lookup(seqs[1]) == 0 and store.evicted == 1
    assert [store.lookup(seqs[s]) for s in (0, 2, 3, 4)] == [CHUNK] * 4
    assert store.host_bytes == 2 * CHUNK_BYTES and store.disk_bytes == 2 * CHUNK_BYTES
    store.close()
    assert not store.tier.path.exists() and len(store) == 0


def test_a_prefix_loses_its_tail_first(tmp_path):
    store = KVStore(CHUNK, host_max_bytes=3 * CHUNK_BYTES)
    long = list(range(3 * CHUNK))
    store.put(long, *kv(3 * CHUNK))
    store.put(list(range(5000, 5000 + CHUNK)), *kv(CHUNK, 1))  # one chunk over the cap: LRU goes
    assert store.lookup(long) == 2 * CHUNK  # the last chunk of the prefix was evicted, not the first


def test_no_tail_is_kept_behind_a_missing_head(tmp_path):
    # a sequence larger than the whole store keeps its head
    store = KVStore(CHUNK, host_max_bytes=2 * CHUNK_BYTES, disk_max_bytes=3 * CHUNK_BYTES, disk_dir=tmp_path)
    long = list(range(6 * CHUNK))
    assert store.put(long, *kv(6 * CHUNK)) == 6
    assert store.lookup(long) == 5 * CHUNK and len(store) == 5 and store.evicted == 1
    # across the tiers: a second sequence pushes the first one's tail out, never its head
    store = KVStore(CHUNK, host_max_bytes=2 * CHUNK_BYTES, disk_max_bytes=3 * CHUNK_BYTES, disk_dir=tmp_path)
    first, second = list(range(5 * CHUNK)), list(range(9000, 9000 + 3 * CHUNK))
    store.put(first, *kv(5 * CHUNK))
    assert store.get(first).tokens == 5 * CHUNK
    store.put(second, *kv(3 * CHUNK, 1))
    assert store.lookup(first) == 2 * CHUNK and store.lookup(second) == 3 * CHUNK and len(store) == 5
    # a prefix extended later: dropping its middle chunk drops what follows it too
    store = KVStore(CHUNK, host_max_bytes=3 * CHUNK_BYTES)
    base = list(range(2 * CHUNK))
    store.put(base, *kv(2 * CHUNK))
    store.put(base + list(range(500, 500 + CHUNK)), *kv(3 * CHUNK))  # chunk 3 of the same prefix
    store.put(list(range(7000, 7000 + CHUNK)), *kv(CHUNK, 2))  # over the cap: the prefix's last chunk goes
    assert store.lookup(base + list(range(500, 500 + CHUNK))) == 2 * CHUNK and len(store) == 3


def test_damaged_or_missing_files_are_misses_with_a_warning(tmp_path):
    store = KVStore(CHUNK, host_max_bytes=CHUNK_BYTES, disk_max_bytes=10 * CHUNK_BYTES, disk_dir=tmp_path)
    tokens = list(range(4 * CHUNK))
    keys, values = kv(4 * CHUNK)
    store.put(tokens, keys, values)  # host memory holds one chunk, the head; chunks 1-3 spill to disk
    ks = chunk_keys(tokens, CHUNK)
    assert list(store._host) == [ks[0]] and set(store._disk) == set(ks[1:])
    files = {i: store._disk[ks[i]][0] for i in (1, 2, 3)}
    data = bytearray(files[3].read_bytes())
    data[-1] ^= 0xFF  # flip one payload byte
    files[3].write_bytes(bytes(data))
    with pytest.warns(StoreWarning, match="checksum mismatch"):
        p = store.get(tokens)
    assert p.tokens == 3 * CHUNK and p.disk_bytes == 2 * CHUNK_BYTES and p.host_bytes == CHUNK_BYTES
    assert store.corrupt == 1 and not files[3].exists() and torch.equal(p.keys[1], keys[1][:, :3 * CHUNK])
    files[2].write_bytes(files[2].read_bytes()[:-10])
    with pytest.warns(StoreWarning, match="truncated"):
        assert store.get(tokens).tokens == 2 * CHUNK
    files[1].unlink()  # deleted between turns
    with pytest.warns(StoreWarning, match="No such file"):
        assert store.get(tokens).tokens == CHUNK
    assert store.corrupt == 3 and store.disk_bytes == 0 and store.lookup(tokens) == CHUNK


def test_bad_caps_and_directories():
    with pytest.raises(ValueError, match=r"host_max_bytes 1,000 is smaller than one chunk: 8 tokens × 192 bytes = "
                                         r"1,536 bytes"):
        KVStore(CHUNK, host_max_bytes=1000, token_bytes=TOKEN_BYTES)
    store = KVStore(CHUNK, host_max_bytes=1000)
    with pytest.raises(ValueError, match="host_max_bytes 1,000 is smaller than one chunk"):
        store.put(list(range(CHUNK)), *kv(CHUNK))
    with pytest.raises(ValueError, match="disk_max_bytes 100 is smaller than one chunk"):
        KVStore(CHUNK, disk_max_bytes=100, token_bytes=TOKEN_BYTES)
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1"):
        KVStore(0)
    with pytest.raises(DiskTierError, match="cannot create the disk tier in /nonexistent/dir"):
        KVStore(CHUNK, disk_max_bytes=10 * CHUNK_BYTES, disk_dir="/nonexistent/dir")
    ok = KVStore(CHUNK, host_max_bytes=10 * CHUNK_BYTES)
    ok.put(list(range(CHUNK)), *kv(CHUNK))
    with pytest.raises(ValueError, match="one model and dtype per store"):
        ok.put(list(range(CHUNK)), *[[t.half() for t in x] for x in kv(CHUNK, 3)])


def two_turns(tiny_model, tmp_path, kind, options, seed):
    """For the restore-vs-recompute tests: (model, device, generate(ids, cache, n, cached=0) -> ids, fresh() -> an
    empty cache of the mode, the generator, turn 1's 40 random prompt ids)."""
    from kvbench.offload import make_cache
    from kvbench.bench.engines.decode import Clock, greedy_decode

    m, dev = tiny_model, tiny_model.device
    clock = Clock(dev)
    g = torch.Generator().manual_seed(seed)
    first = torch.randint(0, m.shape.vocab_size, (1, 40), generator=g)

    def generate(ids, cache, n, cached=0):
        mask = torch.ones((1, cached + ids.shape[1]), dtype=torch.long)
        return greedy_decode(m.model, ids, mask, cache, n, clock)[0]

    def fresh():
        return make_cache(kind, m.model.config, dev, disk_dir=str(tmp_path), **options)

    return m, dev, generate, fresh, g, first


@pytest.mark.parametrize("kind,options", [
    ("none", {}), ("full", {}), ("hierarchical", {"window": 4}), ("hierarchical", {"window": 64}),
    ("dynamic", {"min_window": 4}), ("full", {"host_max_tokens": 16}),
], ids=["none", "full", "hier4", "hier64", "dynamic", "full-disk"])
def test_a_restored_prefix_generates_the_ids_of_recompute(tiny_model, tmp_path, kind, options):
    from kvbench.offload.cache_kv import restore, sequence_kv

    m, dev, generate, fresh, g, first = two_turns(tiny_model, tmp_path, kind, options, 7)

    # turn 1 in the mode under test; its 45 cached tokens are stored (5 whole chunks of 8), partly on disk
    cache = fresh()
    out1 = generate(first, cache, 6)
    seq = torch.cat([first, out1[:, :5]], dim=1)
    keys, values = sequence_kv(cache)
    assert keys[0].shape == (m.shape.kv_heads, 45, m.shape.head_dim)
    store = KVStore(CHUNK, host_max_bytes=2 * 5 * 8 * 512 // 5, disk_max_bytes=2**20, disk_dir=tmp_path,
                    tails=False)
    assert store.put(seq[0].tolist(), keys, values) == 5 and store.disk_bytes == 3 * 8 * 512
    # turn 2: the whole of turn 1 and 13 new tokens; the shared 45 tokens end inside a chunk: 40 are restored
    second = torch.cat([seq, torch.randint(0, m.shape.vocab_size, (1, 13), generator=g)], dim=1)
    prefix = store.get(second[0].tolist(), max_tokens=second.shape[1] - 1)
    assert prefix.tokens == 40 and prefix.disk_bytes == 3 * 8 * 512 and prefix.host_bytes == 2 * 8 * 512
    for layer in range(len(keys)):
        assert torch.equal(prefix.keys[layer], keys[layer][:, :40])
        assert torch.equal(prefix.values[layer], values[layer][:, :40])
    recompute = generate(second, fresh(), 8)
    cache = fresh()
    restore(cache, prefix, dev, m.dtype)
    assert cache.get_seq_length() == 40
    restored = generate(second[:, 40:], cache, 8, cached=40)
    assert restored.tolist() == recompute.tolist()
    assert cache.get_seq_length() == second.shape[1] + 7
    store.close()


@pytest.mark.parametrize("kind,options", [
    ("none", {}), ("full", {}), ("hierarchical", {"window": 4}), ("dynamic", {"min_window": 4}),
    ("full", {"host_max_tokens": 16}),
], ids=["none", "full", "hier4", "dynamic", "full-disk"])
def test_a_restored_tail_generates_the_ids_of_recompute(tiny_model, tmp_path, kind, options):
    """Turn 1 holds 45 tokens: with tails, turn 2 restores all 45 (5 whole chunks of 8 and a tail of 5), not 40."""
    from kvbench.offload.cache_kv import restore, sequence_kv

    m, dev, generate, fresh, g, first = two_turns(tiny_model, tmp_path, kind, options, 11)

    cache = fresh()
    out1 = generate(first, cache, 6)
    seq = torch.cat([first, out1[:, :5]], dim=1)
    store = KVStore(CHUNK, host_max_bytes=2 * 8 * 512, disk_max_bytes=2**20, disk_dir=tmp_path)
    assert store.put(seq[0].tolist(), *sequence_kv(cache)) == 6 and store.disk_bytes == (3 * 8 + 5) * 512
    second = torch.cat([seq, torch.randint(0, m.shape.vocab_size, (1, 13), generator=g)], dim=1)
    prefix = store.get(second[0].tolist(), max_tokens=second.shape[1] - 1)
    assert (prefix.tokens, prefix.tail_tokens) == (45, 5)
    recompute = generate(second, fresh(), 8)
    cache = fresh()
    restore(cache, prefix, dev, m.dtype)
    restored = generate(second[:, 45:], cache, 8, cached=45)
    assert restored.tolist() == recompute.tolist() and cache.get_seq_length() == second.shape[1] + 7
    store.close()


def test_restore_and_sequence_kv_refuse_what_they_cannot_do(tiny_model):
    from kvbench.offload import make_cache
    from kvbench.offload.cache_kv import restore, sequence_kv
    from kvbench.offload.store import Prefix

    m = tiny_model
    cache = make_cache("none", m.model.config, m.device)
    with pytest.raises(ValueError, match="layer 0 holds no KV"):
        sequence_kv(cache)
    k = [torch.zeros(m.shape.kv_heads, 8, m.shape.head_dim)] * m.shape.layers
    restore(cache, Prefix(8, k, k), m.device)
    assert cache.get_seq_length() == 8 and sequence_kv(cache)[0][1].shape[1] == 8
    with pytest.raises(ValueError, match=r"restore needs an empty cache \(it holds 8 tokens\)"):
        restore(cache, Prefix(8, k, k), m.device)
    with pytest.raises(ValueError, match="the prefix has 1 layers, the cache 2"):
        restore(make_cache("full", m.model.config, m.device), Prefix(8, k[:1], k[:1]), m.device)


@pytest.mark.parametrize("page_cache", [False, True])
def test_disk_chunks_are_synced_and_dropped_from_the_page_cache_unless_kept(tmp_path, page_cache):
    """As the offload disk tier: a spilled chunk is a device read, not RAM, unless ``page_cache`` keeps it."""
    from test_offload import resident_pages

    store = KVStore(CHUNK, host_max_bytes=CHUNK_BYTES, disk_max_bytes=4 * CHUNK_BYTES, disk_dir=tmp_path,
                    page_cache=page_cache)
    seqs = [[s * 1000 + i for i in range(CHUNK)] for s in range(3)]
    data = [kv(CHUNK, seed=s) for s in range(3)]
    for s in range(3):
        store.put(seqs[s], *data[s])
    files = sorted(store.tier.path.glob("*.kv"))
    assert len(files) == 2  # seqs 0 and 1 spilled
    assert [resident_pages(f) > 0 for f in files] == [page_cache] * 2
    p = store.get(seqs[0])  # read back from disk: the same bytes, and dropped again after the read
    assert p.disk_bytes == CHUNK_BYTES and torch.equal(p.keys[1], data[0][0][1])
    assert [resident_pages(f) > 0 for f in sorted(store.tier.path.glob("*.kv"))] == [page_cache] * 2
    store.close()


def test_a_quantized_store_holds_int8_parts_on_host_and_disk_and_decodes_within_their_bound(tmp_path):
    from kvbench.offload.host_tiers import Int8, host_format

    # int8 K (DIM + 4 bytes per token and head) and bfloat16 V (2 × DIM): 3 × 2 × (8 + 8) = 96 bytes per token
    token_bytes = LAYERS * HEADS * ((DIM + 4) + 2 * DIM)
    store = KVStore(CHUNK, host_max_bytes=token_bytes * CHUNK, disk_max_bytes=4 * token_bytes * CHUNK,
                    disk_dir=tmp_path, formats=(Int8(), host_format("bfloat16")))
    seqs = [[s * 1000 + i for i in range(CHUNK + 3)] for s in range(2)]
    data = [kv(CHUNK + 3, seed=s) for s in range(2)]
    for s in range(2):
        store.put(seqs[s], *data[s])
    # 2 whole chunks and 2 tails: physical bytes, half of them on disk
    assert store.host_bytes + store.disk_bytes == 2 * token_bytes * (CHUNK + 3)
    assert store.disk_bytes > 0 and len(list(store.tier.path.glob("*.kv"))) >= 1
    for s in range(2):  # sequence 0 comes back from disk, 1 from host
        p = store.get(seqs[s])
        assert p.tokens == CHUNK + 3 and p.host_bytes + p.disk_bytes == token_bytes * (CHUNK + 3)
        for layer in range(LAYERS):
            k, v = data[s][0][layer], data[s][1][layer]
            assert p.keys[layer].dtype == p.values[layer].dtype == torch.float32
            bound = k.abs().amax(-1, keepdim=True) / 254  # int8: within half a scale step
            assert (p.keys[layer] - k).abs().le(bound + 1e-7).all() and not torch.equal(p.keys[layer], k)
            assert torch.equal(p.values[layer], v.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="this store holds torch.float32 K/V, not torch.float16"):
        store.put([7] * CHUNK, *[[t.half() for t in x] for x in kv(CHUNK)])
    store.close()
