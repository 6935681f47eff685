"""The offload caches: greedy ids identical to DynamicCache, tiers and accounting, cache operations."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from kvbench.offload import layers
from kvbench.offload.caches import DynamicOffloadCache, FullOffloadCache, HierarchicalCache, OffloadedCache
from kvbench.offload.modes import make_cache
from kvbench.offload.history import History
from kvbench.offload.tiers import DiskTier, DiskTierError, TieredBuffer
from kvbench.offload.transfer import Transfers
from kvbench.bench.engines.decode import cache_keyword, greedy_decode, left_pad

CPU = torch.device("cpu")
NEW = 6


def clock():
    return 0.0


def decode(model, prompts, cache, n=NEW):
    ids, mask = left_pad(prompts, pad_id=0)
    out, _, _ = greedy_decode(model, ids, mask, cache, n, clock)
    return out


def batches(vocab):
    g = torch.Generator().manual_seed(0)
    one = [torch.randint(5, vocab, (23,), generator=g).tolist()]
    four = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (23, 9, 17, 4)]  # left-padded
    return {"batch1": one, "batch4": four}


@pytest.mark.parametrize("which", ["batch1", "batch4"])
@pytest.mark.parametrize("window", [0, 1, 8, 23, 64])  # 0 = full; smaller than, equal to, larger than the prompt
def test_greedy_ids_equal_dynamic_cache_on_tiny_llama(tiny_model, which, window):
    model = tiny_model.model
    prompts = batches(tiny_model.shape.vocab_size)[which]
    ref = decode(model, prompts, DynamicCache(config=model.config))
    cache = HierarchicalCache(model.config, CPU, window=window)
    out = decode(model, prompts, cache)
    assert out.tolist() == ref.tolist()
    width = max(len(p) for p in prompts)
    assert cache.get_seq_length() == width + NEW - 1  # all tokens, not the window
    layer = cache.layers[0]
    assert layer.keys.shape[-2] == min(window, width + NEW - 1)
    assert layer.keys_history.length == width + NEW - 1 - layer.keys.shape[-2]


def test_full_mode_moves_only_new_tokens_to_the_host(tiny_model):
    model = tiny_model.model
    cache = FullOffloadCache(model.config, CPU)
    decode(model, [[7] * 10], cache, n=4)
    # tiny-llama: 2 layers × 2 kv heads × 16 × 4 bytes = 128 B per token for K (same for V)
    per_token = 2 * 16 * 4
    assert cache.engine.stats.d2h_bytes == 2 * 2 * per_token * (10 + 3)  # each token once, K and V, 2 layers
    assert cache.engine.stats.d2h_count == 2 * 2 * 4  # prefill + 3 decode steps
    # history read back per step: steps 2..4 read 10, 11, 12 tokens per layer (K and V); after the last layer
    # of the last step the prefetch wraps to layer 0 (13 tokens) for a step that may come
    assert cache.engine.stats.h2d_bytes == 2 * per_token * (2 * (10 + 11 + 12) + 13)
    assert cache.device_bytes == 0  # everything lives on the host between steps
    assert cache.host_bytes == 4 * 13 * per_token  # K and V × 2 layers, 13 tokens held each
    assert cache.layers[0].keys_history.nbytes == 256 * per_token  # allocated: the first 256-token capacity
    assert cache.device_peak_bytes == 2 * per_token * 13  # one layer's K and V for 13 tokens during attention


def test_pinned_host_bytes_count_the_capacity_of_page_locked_buffers(tiny_model, monkeypatch):
    from kvbench.offload.tiers import HostBuffer

    model = tiny_model.model
    cache = FullOffloadCache(model.config, CPU)  # CPU: pageable buffers, nothing pinned
    decode(model, [[7] * 10], cache, n=4)
    assert cache.pinned is False and cache.pinned_host_peak_bytes == 0
    # what the host tier holds is its capacity (the smallest, 256 tokens), not the 13 filled: what kvbench cost
    # charges
    assert cache.host_allocated_peak_bytes == 256 * 2 * 16 * 4 * 2 * 2
    assert cache.host_bytes == 13 * 2 * 16 * 4 * 2 * 2

    def as_if_pinned(self, shape, dtype):  # CPU torch cannot pin: count pageable buffers as pinned ones
        self.pinned = True
        return torch.empty(shape, dtype=dtype)

    monkeypatch.setattr(HostBuffer, "_allocate", as_if_pinned)
    cache = FullOffloadCache(model.config, CPU)
    decode(model, [[7] * 250], cache, n=10)  # 259 tokens: each buffer grows from 256 to 512 tokens of capacity
    # capacity × 2 kv heads × 16 × 4 bytes, K and V, 2 layers (the filled part is 259 tokens)
    assert cache.pinned_host_peak_bytes == cache.pinned_host_bytes == 512 * 2 * 16 * 4 * 2 * 2
    assert cache.host_bytes == 259 * 2 * 16 * 4 * 2 * 2


def test_hierarchical_keeps_the_window_on_the_device(tiny_model):
    model = tiny_model.model
    cache = make_cache("hierarchical", model.config, CPU, window=5)
    decode(model, [[3] * 12], cache, n=4)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [5, 5]
    assert cache.device_bytes == 2 * 2 * 5 * (2 * 16 * 4)  # 2 layers, K and V, 5 tokens


# every mode with and without the disk tier; dynamic under a budget that makes it shrink and grow
MODES = [
    ("full", {}),
    ("full", {"host_max_tokens": 16}),
    ("hierarchical", {"window": 5, "host_max_tokens": 16}),
    ("hierarchical", {"window": 0, "host_max_tokens": 32}),
    ("dynamic", {"min_window": 4}),
    ("dynamic", {"min_window": 4, "budget_bytes": 80_000}),
    ("dynamic", {"min_window": 4, "max_window": 12, "host_max_tokens": 16}),
]


@pytest.fixture(params=["head-major", "seq-major"])
def layout(request, monkeypatch):
    """Each host-tier layout on CPU: head-major (what CPU uses) and sequence-major (what CUDA uses)."""
    if request.param == "seq-major":
        monkeypatch.setattr(layers, "History", lambda *a, seq_major, **k: History(*a, seq_major=True, **k))
    return request.param


@pytest.mark.parametrize("which", ["batch1", "batch4"])
@pytest.mark.parametrize("kind,options", MODES)
def test_every_mode_and_the_disk_tier_give_the_ids_of_dynamic_cache(tiny_model, tmp_path, layout, which, kind,
                                                                    options):
    model = tiny_model.model
    prompts = batches(tiny_model.shape.vocab_size)[which]
    ref = decode(model, prompts, DynamicCache(config=model.config), n=30)
    with make_cache(kind, model.config, CPU, disk_dir=str(tmp_path), **options) as cache:
        out = decode(model, prompts, cache, n=30)
        assert out.tolist() == ref.tolist()
        assert cache.get_seq_length() == max(len(p) for p in prompts) + 29
        if "host_max_tokens" in options:
            assert cache.disk_bytes > 0 and cache.engine.stats.disk_read_bytes > 0
    assert list(tmp_path.iterdir()) == []  # the disk tier's directory is gone


@pytest.mark.model
@pytest.mark.parametrize("kind,options", [("full", {}), ("hierarchical", {"window": 16}),
                                          ("hierarchical", {"window": 0}),
                                          ("hierarchical", {"window": 8, "host_max_tokens": 16}),
                                          ("dynamic", {"min_window": 32, "budget_bytes": 2_500_000})])
@pytest.mark.parametrize("lengths", [(40,), (40, 25, 33, 12)], ids=["batch1", "batch4"])
def test_greedy_ids_equal_dynamic_cache_on_smollm2(smol_model, kind, options, lengths):
    model = smol_model.model
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(20, 40000, (n,), generator=g).tolist() for n in lengths]
    if kind == "dynamic":  # the budget scales with the batch, so the window shrinks at the prefill in both
        options = {**options, "budget_bytes": options["budget_bytes"] * len(prompts) // 4}
    ref = decode(model, prompts, DynamicCache(config=model.config), n=8)
    with make_cache(kind, model.config, CPU, **options) as cache:
        out = decode(model, prompts, cache, n=8)
        if kind == "dynamic":
            assert [e["reason"].split(":")[0] for e in cache.events][0] == "device KV would exceed the budget"
            assert cache.device_peak_bytes <= options["budget_bytes"]
    assert out.tolist() == ref.tolist()


@pytest.mark.parametrize("seq_major", [False, True], ids=["head-major", "seq-major"])
@pytest.mark.parametrize("host_max_tokens", [None, 16])
def test_a_tiered_buffer_gives_back_what_it_was_given_in_either_layout(tmp_path, seq_major, host_max_tokens):
    engine, disk = Transfers(CPU), DiskTier(tmp_path)
    hist = TieredBuffer(host_max_tokens=host_max_tokens, disk=disk, seq_major=seq_major)
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randn(2, 3, n, 4, generator=g) for n in (7, 1, 1, 40, 1, 300)]
    chunks[3] = chunks[3][:, :, ::2]  # a strided source of 20 tokens, as a slice of the device window is
    ref = torch.empty(2, 3, 0, 4)
    for c in chunks:
        hist.append(c, engine)
        ref = torch.cat([ref, c], dim=-2)
        assert torch.equal(hist.view(engine), ref)
    assert hist.length == 330 and hist.host.capacity == (512 if host_max_tokens is None else 256)
    b, h, d = 2, 3, 4
    assert hist.host.buf.shape == ((hist.host.capacity, b, h, d) if seq_major else (b, h, hist.host.capacity, d))
    if host_max_tokens:  # 330 tokens, at most 16 on the host: the oldest 320 (20 blocks) on disk
        assert (hist.disk_length, hist.host.length) == (320, 10)
        assert hist.disk_bytes == 320 * b * h * d * 4 and hist.host_bytes == 10 * b * h * d * 4
    *disk_part, host_part = hist.parts(engine)
    if seq_major:  # one dense block per tier (one asynchronous copy on CUDA)
        assert host_part.permute(2, 0, 1, 3).is_contiguous() and host_part.stride()[-2:] == (b * h * d, 1)
    else:  # one contiguous run per head, as in DynamicCache
        assert host_part.stride()[-2:] == (d, 1)
    assert all(p.permute(2, 0, 1, 3).is_contiguous() for p in disk_part)  # the disk tier is sequence-major
    assert len(disk_part) == (1 if host_max_tokens else 0)
    assert torch.equal(hist.pop_tail(4, engine), ref[:, :, -4:])
    hist.truncate(300, engine)
    assert torch.equal(hist.view(engine), ref[:, :, :300])
    hist.replace(ref[[1, 0]], engine)  # a batch reorder
    assert torch.equal(hist.view(engine), ref[[1, 0]]) and hist.length == 330
    disk.close()
    assert list(tmp_path.iterdir()) == []


def test_negative_window_is_refused(tiny_model):
    with pytest.raises(ValueError, match="window must be >= 0 tokens, got -1"):
        OffloadedCache(tiny_model.model.config, CPU, window=-1)
    for budget in (0, -5):
        with pytest.raises(ValueError, match=f"budget_bytes must be > 0 bytes, got {budget}"):
            make_cache("dynamic", tiny_model.model.config, CPU, budget_bytes=budget)
    with pytest.raises(ValueError, match="reserve_bytes must be >= 0 bytes, got -1"):
        DynamicOffloadCache(tiny_model.model.config, CPU, reserve_bytes=-1)


def test_a_closed_cache_says_so_when_used_again(tiny_model, tmp_path):
    model = tiny_model.model
    with FullOffloadCache(model.config, CPU, host_max_tokens=16, disk_dir=str(tmp_path)) as cache:
        decode(model, [[7] * 40], cache, n=2)
    with pytest.raises(DiskTierError, match="this FullOffloadCache was closed .* make a new cache"):
        decode(model, [[7] * 40], cache, n=2)
    assert list(tmp_path.iterdir()) == []


CACHE_OPS = [
    ("hierarchical", {"window": 0}),
    ("hierarchical", {"window": 4}),
    ("hierarchical", {"window": 4, "host_max_tokens": 16}),
    ("dynamic", {"min_window": 4, "budget_bytes": 60_000}),
]


@pytest.mark.parametrize("kind,options", CACHE_OPS)
def test_beam_search_crop_and_reuse_match_dynamic_cache(tiny_model, tmp_path, layout, kind, options):
    model = tiny_model.model
    kv = cache_keyword(model)  # `cache` on transformers ≥ 5.2x, `past_key_values` before (5.17 on the GPU box)

    def fresh():
        return make_cache(kind, model.config, CPU, disk_dir=str(tmp_path), **options)

    ids = torch.arange(11, 51)[None]  # 40 tokens: with a host cap of 16, most of the history is on disk
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    ref = model.generate(ids, num_beams=3, **{kv: DynamicCache(config=model.config)}, **kw)
    out = model.generate(ids, num_beams=3, **{kv: fresh()}, **kw)  # reorders across device, host and disk
    assert out.tolist() == ref.tolist()

    # crop then continue, and a second generate on the same cache
    ref_cache, cache = DynamicCache(config=model.config), fresh()
    a = model.generate(ids, **{kv: ref_cache}, **kw)
    b = model.generate(ids, **{kv: cache}, **kw)
    assert a.tolist() == b.tolist()
    ref_cache.crop(-3)
    cache.crop(-3)
    assert cache.get_seq_length() == ref_cache.get_seq_length() == 40 + 6 - 1 - 3
    nxt_ref = model(a[:, -4:-3], **{kv: ref_cache}, use_cache=True).logits
    nxt = model(a[:, -4:-3], **{kv: cache}, use_cache=True).logits
    assert torch.equal(nxt_ref, nxt)
    cache.crop(-30)  # into the disk tier
    ref_cache.crop(-30)
    assert torch.equal(model(a[:, 13:14], **{kv: ref_cache}, use_cache=True).logits,
                       model(a[:, 13:14], **{kv: cache}, use_cache=True).logits)

    # batch changes, with most of the history on disk where there is a disk tier: 3 → 2 → 4 → 1 sequences
    three = torch.arange(5, 125).reshape(3, 40)
    ref_cache, cache = DynamicCache(config=model.config), fresh()
    model(three, **{kv: ref_cache}, use_cache=True)
    model(three, **{kv: cache}, use_cache=True)
    for change, arg, rows in [("batch_select_indices", torch.tensor([2, 0]), 2), ("batch_repeat_interleave", 2, 4),
                              ("batch_select_indices", torch.tensor([1]), 1)]:
        getattr(ref_cache, change)(arg)
        getattr(cache, change)(arg)
        step = torch.full((rows, 1), 13)
        assert torch.equal(model(step, **{kv: ref_cache}, use_cache=True).logits,
                           model(step, **{kv: cache}, use_cache=True).logits), change
    if "host_max_tokens" in options:
        assert cache.disk_bytes > 0


@pytest.fixture(scope="module")
def tiny_mha_model(tmp_path_factory):
    """tiny-llama with as many kv heads as query heads: attention gets the offloaded K/V as they are (no GQA copy)."""
    import json

    from kvbench.models import load, preset_path
    from kvbench.scenario import ModelSpec

    config = json.loads(preset_path("tiny-llama").read_text())
    config["num_key_value_heads"] = config["num_attention_heads"]
    path = tmp_path_factory.mktemp("mha") / "config.json"
    path.write_text(json.dumps(config))
    return load(ModelSpec(config=str(path), weights="random"), "cpu", seed=0)


@pytest.mark.parametrize("kind,options", MODES)
def test_ids_equal_dynamic_cache_without_grouped_query_attention(tiny_mha_model, tmp_path, kind, options):
    model = tiny_mha_model.model
    prompts = batches(tiny_mha_model.shape.vocab_size)["batch4"]
    ref = decode(model, prompts, DynamicCache(config=model.config), n=30)
    with make_cache(kind, model.config, CPU, disk_dir=str(tmp_path), **options) as cache:
        assert decode(model, prompts, cache, n=30).tolist() == ref.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu.sh runs it)")
@pytest.mark.parametrize("kind,options", MODES + [("hierarchical", {"window": w}) for w in (0, 1, 8, 23, 64)])
def test_every_mode_gives_the_ids_of_dynamic_cache_on_cuda(tmp_path, kind, options):
    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    m = load(ModelSpec(preset="tiny-llama", weights="random"), "cuda", seed=0)
    prompts = batches(m.shape.vocab_size)["batch4"]
    ids, mask = left_pad(prompts, pad_id=0)
    ids, mask = ids.to(m.device), mask.to(m.device)

    def run(cache):
        out, _, _ = greedy_decode(m.model, ids, mask, cache, 40, clock)
        return out.tolist()

    ref = run(DynamicCache(config=m.model.config))
    with make_cache(kind, m.model.config, m.device, disk_dir=str(tmp_path), **options) as cache:
        assert run(cache) == ref
        assert cache.get_seq_length() == max(len(p) for p in prompts) + 39
        # page-locked host buffers (asynchronous copies) whenever anything left the device
        assert cache.pinned is (True if cache.host_peak_bytes else None)
    assert list(tmp_path.iterdir()) == []


# Sliding-window models (conftest.SLIDING_CONFIGS: window 8, 256 B per token and layer): a batch of 2 prompts of
# 24 tokens, 20 new ones, so 24 + 20 - 1 = 43 tokens cached per layer. A sliding layer keeps its last 8 - 1 = 7
# (transformers' DynamicSlidingWindowLayer); it stays on the device in every mode and never crosses the link.
SLIDING_MODES = [("none", {}), ("full", {}), ("hierarchical", {"window": 4}),
                 ("dynamic", {"min_window": 4, "max_window": 4}), ("full", {"host_max_tokens": 16})]
TOKEN_LAYER = 2 * 2 * 16 * 4  # K and V × 2 kv heads × head_dim 16 × float32
SLIDING_LAYER = 7 * TOKEN_LAYER * 2  # 7 tokens × batch 2 = 3,584 B per sliding layer
# bytes after the run, (device, host, disk): mistral has 2 sliding layers and no full one; gemma2 2 of each
SLIDING_BYTES = {
    ("mistral", "none"): (2 * SLIDING_LAYER, 0, 0),  # 7,168: nothing grows past the window
    ("mistral", "full"): (2 * SLIDING_LAYER, 0, 0),
    ("mistral", "hierarchical"): (2 * SLIDING_LAYER, 0, 0),
    ("mistral", "dynamic"): (2 * SLIDING_LAYER, 0, 0),
    ("mistral", "full+disk"): (2 * SLIDING_LAYER, 0, 0),
    # full layers: 43 tokens × 256 B × batch 2 = 22,016 B each
    ("gemma2", "none"): (2 * SLIDING_LAYER + 2 * 43 * TOKEN_LAYER * 2, 0, 0),  # 7,168 + 44,032 = 51,200
    ("gemma2", "full"): (2 * SLIDING_LAYER, 2 * 43 * TOKEN_LAYER * 2, 0),  # 7,168 | 44,032 | 0
    # window 4 on the device, 39 older tokens on the host: 7,168 + 4,096 = 11,264 | 39,936
    ("gemma2", "hierarchical"): (2 * SLIDING_LAYER + 2 * 4 * TOKEN_LAYER * 2, 2 * 39 * TOKEN_LAYER * 2, 0),
    ("gemma2", "dynamic"): (2 * SLIDING_LAYER + 2 * 4 * TOKEN_LAYER * 2, 2 * 39 * TOKEN_LAYER * 2, 0),
    # host cap 16: whole blocks of 16 spill, 32 tokens on disk and 11 on the host: 7,168 | 11,264 | 32,768
    ("gemma2", "full+disk"): (2 * SLIDING_LAYER, 2 * 11 * TOKEN_LAYER * 2, 2 * 32 * TOKEN_LAYER * 2),
}


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
@pytest.mark.parametrize("kind,options", SLIDING_MODES, ids=["none", "full", "hierarchical", "dynamic", "full+disk"])
def test_sliding_window_layers_stay_on_the_device_with_exact_bytes(sliding_models, tmp_path, name, kind, options):
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from kvbench.offload.caches import kv_bytes

    m = sliding_models[name]
    model = m.model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 256, (24,), generator=g).tolist() for _ in range(2)]
    ref = decode(model, prompts, DynamicCache(config=model.config), n=20)
    label = "full+disk" if "host_max_tokens" in options else kind
    cache = make_cache(kind, model.config, CPU, disk_dir=str(tmp_path), **options)
    try:
        out = decode(model, prompts, cache, n=20)
        assert out.tolist() == ref.tolist()
        sliding = [layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer)]
        assert len(sliding) == 2  # mistral: both layers (no layer_types); gemma2: layers 0 and 2
        assert [layer.keys.nbytes + layer.values.nbytes for layer in sliding] == [SLIDING_LAYER] * 2
        device, host, disk = SLIDING_BYTES[(name, label)]
        if kind == "none":
            assert kv_bytes(cache, CPU) == (device, 0)
            stored = device
        else:
            assert (cache.device_bytes, cache.host_bytes, cache.disk_bytes) == (device, host, disk)
            stored = device + host + disk
            assert cache.stored_bytes == cache.stored_peak_bytes == stored
            if disk == 0:  # each full-layer token crossed once; the sliding layers never did
                assert cache.engine.stats.d2h_bytes == host
            if not cache._offloaded:
                assert cache.engine.stats.h2d_bytes == cache.engine.stats.d2h_bytes == 0
    finally:
        if kind != "none":
            cache.close()
    # the run-time prediction (the cached_kv_bytes of the model's shape) is exactly what the cache held
    assert m.shape.cached_kv_bytes(43, 4) * 2 == stored == {"mistral": 7_168, "gemma2": 51_200}[name]


# Device peak against `none` on the sliding configs: 1 prompt of 40 tokens, 8 new, so 40 + 8 - 1 = 47 tokens go
# through each layer; a sliding layer holds 7, a full one 47 in `none`. `none`'s peak is read as the runner reads it
# (kv_bytes after every step); an offload cache's is its own accounting, which also sees the K/V an offloaded layer
# hands to attention. A sliding layer's update hands attention its 7 held tokens + the new ones (the whole 40-token
# prompt in the prefill) in both, which neither counts: mistral once read 2 × 7 × 256 + 40 × 256 = 13,824 B here.
# The documented staging beyond `none`: one offloaded layer's window (window × 256 B × batch 1), held twice while
# that layer's concatenation exists; it is passed only by a window over half the 47 tokens (32 here).
PEAK_PROMPT, PEAK_NEW = 40, 8
PEAK_MODES = [("full", "full", {}), ("hierarchical-4", "hierarchical", {"window": 4}),
              ("hierarchical-32", "hierarchical", {"window": 32}), ("hierarchical-64", "hierarchical", {"window": 64}),
              ("dynamic", "dynamic", {"min_window": 16, "budget_bytes": 20_000})]
PEAK_IDS = [label for label, _, _ in PEAK_MODES]
NONE_PEAK = {"mistral": 2 * 7 * TOKEN_LAYER,  # 3,584
             "gemma2": (2 * 7 + 2 * 47) * TOKEN_LAYER}  # 3,584 + 24,064 = 27,648
# (device peak, window whose copy is the staging: 0 where nothing is staged); gemma2's peak is at layer 3's update
# in the last step: sliding 7 + 7, layer 1's window, layer 3's window and its 47-token concatenation
PEAKS = {
    **{("mistral", i): (2 * 7 * TOKEN_LAYER, 0) for i in PEAK_IDS},  # 3,584: nothing is offloaded, nothing staged
    ("gemma2", "full"): ((14 + 0 + 0 + 47) * TOKEN_LAYER, 0),  # 15,616
    ("gemma2", "hierarchical-4"): ((14 + 4 + 4 + 47) * TOKEN_LAYER, 4),  # 17,664
    ("gemma2", "hierarchical-32"): ((14 + 32 + 32 + 47) * TOKEN_LAYER, 32),  # 32,000 = 27,648 + 17 tokens ≤ 32
    ("gemma2", "hierarchical-64"): (NONE_PEAK["gemma2"], 0),  # the window holds every token: as none
    # budget 20,000: window 16 → 10 in the prefill ((20,000 − 3,584 − 40 × 256) // (2 × 256) = 12 fit), 10 → 7 at
    # step 5 (9 fit); peak at step 4's layer 1, 44 tokens cached: 14 + 10 + 10 + 44 (≤ the budget)
    ("gemma2", "dynamic"): ((14 + 10 + 10 + 44) * TOKEN_LAYER, 10),  # 19,968
}


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
@pytest.mark.parametrize("label,kind,options", PEAK_MODES, ids=PEAK_IDS)
def test_sliding_models_hold_no_more_on_the_device_than_none_beyond_one_window(sliding_models, name, label, kind,
                                                                              options):
    from kvbench.offload.caches import kv_bytes

    model = sliding_models[name].model
    g = torch.Generator().manual_seed(0)
    ids, mask = left_pad([torch.randint(5, 256, (PEAK_PROMPT,), generator=g).tolist()], pad_id=0)
    ref = DynamicCache(config=model.config)
    none_peak = 0

    def read_none() -> None:
        nonlocal none_peak
        none_peak = max(none_peak, kv_bytes(ref, CPU)[0])

    ref_ids, _, _ = greedy_decode(model, ids, mask, ref, PEAK_NEW, clock, after_step=read_none)
    assert none_peak == NONE_PEAK[name]
    with make_cache(kind, model.config, CPU, **options) as cache:
        out, _, _ = greedy_decode(model, ids, mask, cache, PEAK_NEW, clock)
    assert out.tolist() == ref_ids.tolist()
    peak, window = PEAKS[(name, label)]
    assert cache.device_peak_bytes == peak
    assert cache.device_peak_bytes <= none_peak + window * TOKEN_LAYER  # the staging: one window, batch 1
    if (name, label) != ("gemma2", "hierarchical-32"):  # the one window over half the tokens
        assert cache.device_peak_bytes <= none_peak
    if kind == "dynamic" and name == "gemma2":
        assert [(e["step"], e["old"], e["new"]) for e in cache.events] == [(0, 16, 10), (5, 10, 7)]
        assert cache.device_peak_bytes <= options["budget_bytes"]


def resident_pages(path) -> int:
    """Pages of the file at ``path`` in the page cache, by mincore(2) on a fresh read-only mapping (mapping faults
    nothing in). Skips the test where mincore cannot be called."""
    import ctypes
    import mmap
    import os

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype, libc.mincore.restype = ctypes.c_void_p, ctypes.c_int
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError) as exc:
        pytest.skip(f"cannot call mmap/mincore through ctypes here: {exc}")
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            pytest.skip(f"mmap failed: errno {ctypes.get_errno()}")
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        if rc != 0:
            pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        return sum(v & 1 for v in vec)
    finally:
        os.close(fd)


def test_disk_tier_pages_are_synced_and_not_resident_after_generation(tiny_model, tmp_path):
    import os

    from kvbench.offload.disk import CAN_DROP

    if not CAN_DROP:
        pytest.skip("os.posix_fadvise is missing on this platform: the disk tier cannot drop its pages")
    probe = tmp_path / "probe"  # the check itself: a file just written through the page cache is resident
    probe.write_bytes(b"x" * 65536)
    if resident_pages(probe) == 0:
        pytest.skip("mincore reports no page-cache pages even for a file just written: residency cannot be seen")
    probe.unlink()
    model = tiny_model.model
    prompts = batches(tiny_model.shape.vocab_size)["batch4"]
    ref = decode(model, prompts, DynamicCache(config=model.config), n=30)
    for page_cache in (False, True):
        with make_cache("full", model.config, CPU, disk_dir=str(tmp_path), disk_page_cache=page_cache,
                        host_max_tokens=16) as cache:
            out = decode(model, prompts, cache, n=30)
            assert out.tolist() == ref.tolist()
            stats, tier = cache.engine.stats, cache.disk
            files = sorted(tier.path.glob("*.kv"))
            assert len(files) == 4 and all(os.path.getsize(f) > 4096 for f in files)  # K, V × 2 layers; > 1 page
            assert stats.disk_write_bytes > 0 and stats.disk_read_bytes > 0  # generated past the host cap
            resident = [resident_pages(f) for f in files]
            if page_cache:  # today's behaviour, kept on request: written pages stay in RAM, unsynced
                assert all(r > 0 for r in resident) and tier.synced_bytes == 0 and not tier.drops
            else:  # every write synced, and nothing of the files left in the page cache after the last read
                assert resident == [0, 0, 0, 0]
                assert tier.synced_bytes == stats.disk_write_bytes and tier.sync_count == stats.disk_write_count
                assert tier.syncs and tier.drops
    assert list(tmp_path.iterdir()) == []


# A kvbench in another PID namespace (another container) on this host: it owns its tier directory through the
# flock on the owner file, and its PID (4999999, above any pid_max) means nothing here.
_FOREIGN_OWNER = """
import fcntl, os, sys
from kvbench.offload import disk
d = sys.argv[1]
os.mkdir(d, 0o700)
fd = os.open(os.path.join(d, disk.OWNER_FILE), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, disk._owner_text(sys.argv[2], 4999999))
with open(os.path.join(d, "1.kv"), "wb") as f:
    f.write(b"kv" * 512)
print("ready", flush=True)
sys.stdin.read()
"""


def _dead_tier(path, host, pid=4999999):
    """A tier directory whose owner died (nothing holds its lock)."""
    from kvbench.offload import disk

    path.mkdir(mode=0o700)
    (path / disk.OWNER_FILE).write_bytes(disk._owner_text(host, pid))
    (path / "1.kv").write_bytes(b"kv")
    return path


def test_a_live_tier_of_another_pid_namespace_survives_the_sweep_and_goes_once_its_owner_dies(tmp_path):
    import socket
    import subprocess
    import sys

    live = tmp_path / "kvbench-kv-4999999-abcd1234"
    owner = subprocess.Popen([sys.executable, "-c", _FOREIGN_OWNER, str(live), socket.gethostname()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline() == "ready\n"
        mine = DiskTier(tmp_path)  # sweeps tmp_path
        assert (live / "1.kv").read_bytes() == b"kv" * 512  # the other run's files are still there
    finally:
        owner.communicate("", timeout=30)  # it exits: its lock is released
    assert owner.returncode == 0
    second = DiskTier(tmp_path)
    assert not live.exists()  # provably dead now: removed
    assert mine.path.is_dir() and second.path.is_dir()  # this process's own live tiers stay
    mine.close(), second.close()
    assert list(tmp_path.iterdir()) == []


def test_the_sweep_removes_only_dead_tiers_of_this_host_by_kvbench_name_never_through_a_link(tmp_path):
    import socket

    from kvbench.offload.disk import remove_stale

    here = socket.gethostname()
    dead = _dead_tier(tmp_path / "kvbench-kv-4999999-dead0001", here)
    elsewhere = _dead_tier(tmp_path / "kvbench-kv-4999999-nfs00001", "another-host")  # its lock may not reach us
    not_ours = _dead_tier(tmp_path / "kvbench-kv-junk", here)  # not a tier's name
    no_owner = tmp_path / "kvbench-kv-4999999-new00001"  # being created: no owner file yet
    no_owner.mkdir()
    target = _dead_tier(tmp_path / "target", here)
    (tmp_path / "kvbench-kv-4999999-link0001").symlink_to(target)
    assert remove_stale(tmp_path) == ["kvbench-kv-4999999-dead0001"]
    assert not dead.exists()
    assert all((d / "1.kv").read_bytes() == b"kv" for d in (elsewhere, not_ours, target)) and no_owner.is_dir()
    assert (tmp_path / "kvbench-kv-4999999-link0001").is_symlink()
    assert remove_stale(tmp_path / "missing") == []
