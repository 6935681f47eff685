"""The host tier's formats (kvbench.offload.host_tiers) and a history held in them (kvbench.offload.history):
round-trip error bounds on known tensors, exact physical and logical bytes, greedy ids where the format is
lossless."""

from __future__ import annotations

import typing

import pytest
import torch
from transformers import DynamicCache

from kvbench.bench.engines.decode import greedy_decode, left_pad
from kvbench.offload.history import History
from kvbench.offload.host_tiers import HOST_DTYPES, Fp8, Int8, hadamard_matrix, host_format
from kvbench.offload.modes import MODES, HostDtype
from kvbench.offload.tiers import DiskTier
from kvbench.offload.transfer import Transfers

CPU = torch.device("cpu")


def known(seed: int = 0, shape=(2, 3, 5, 16)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_the_mode_options_offer_exactly_the_formats():
    assert list(typing.get_args(HostDtype)) == list(HOST_DTYPES)


def test_int8_rounds_each_element_within_half_a_step_of_its_token_and_head():
    x = known()
    q, scale = Int8().encode(x)
    assert (q.dtype, q.shape, scale.dtype, scale.shape) == (torch.int8, x.shape, torch.float32, (2, 3, 5, 1))
    assert torch.equal(scale, x.abs().amax(-1, keepdim=True) / 127)
    err = (Int8().decode((q, scale), torch.float32) - x).abs()
    assert bool((err <= scale / 2 + 1e-6).all())
    assert q.abs().max().item() == 127  # every row's largest element uses the whole range
    # a row of zeros stays zeros (its scale is 1, not 0/127)
    z = torch.zeros(1, 1, 2, 16)
    assert torch.equal(Int8().decode(Int8().encode(z), torch.float32), z)
    # a known value: [127, 63.5, -1] with max 127: scale 1, q = [127, 64, -1] (round half to even: 63.5 → 64)
    q, scale = Int8().encode(torch.tensor([[[[127.0, 63.5, -1.0]]]]))
    assert q.flatten().tolist() == [127, 64, -1] and scale.item() == 1.0


def test_fp8_keeps_three_mantissa_bits_of_each_element():
    x = known(1)
    q, scale = Fp8().encode(x)
    assert (q.dtype, q.shape, scale.shape) == (torch.uint8, x.shape, (2, 3, 5, 1))
    assert torch.equal(scale, x.abs().amax(-1, keepdim=True) / 448)
    err = (Fp8().decode((q, scale), torch.float32) - x).abs()
    assert bool((err <= x.abs() / 16 + scale * 2**-10 + 1e-6).all())
    # the largest element of each row is 448 × scale exactly
    back = Fp8().decode((q, scale), torch.float32)
    assert torch.allclose(back.abs().amax(-1), x.abs().amax(-1))


def test_casts_round_as_their_dtype_and_are_lossless_where_they_are_wide_enough():
    x = known(2)
    assert torch.equal(host_format("float32").decode(host_format("float32").encode(x), torch.float32), x)
    assert torch.equal(host_format("model").decode(host_format("model").encode(x), torch.float32), x)
    (b,) = host_format("bfloat16").encode(x)
    assert b.dtype == torch.bfloat16
    err = (host_format("bfloat16").decode((b,), torch.float32) - x).abs()
    assert bool((err <= x.abs() * 2**-8).all()) and err.max() > 0
    assert [host_format(n).lossless(torch.float32) for n in HOST_DTYPES] == [True, True, False, False, False, False]
    assert [host_format(n).lossless(torch.bfloat16) for n in HOST_DTYPES] == [True, True, True, False, False, False]
    assert not host_format("float32", hadamard=True).lossless(torch.float32)


def test_the_hadamard_matrix_is_its_own_inverse_and_spreads_an_outlier_channel():
    h = hadamard_matrix(16)
    assert torch.allclose(h @ h, torch.eye(16), atol=1e-6) and torch.equal(h, h.T)
    with pytest.raises(ValueError, match="hadamard needs a head_dim that is a power of two, got 12"):
        hadamard_matrix(12)
    # one channel 100× the others: per-row int8 wastes its range on it; rotated, the error is several times smaller
    x = known(3, (1, 2, 64, 16)) * 0.01
    x[..., 5] = 1.0
    plain, rotated = host_format("int8"), host_format("int8", hadamard=True)
    e_plain = (plain.decode(plain.encode(x), torch.float32) - x).pow(2).mean()
    e_rot = (rotated.decode(rotated.encode(x), torch.float32) - x).pow(2).mean()
    assert e_rot < e_plain / 3
    assert rotated.name == "int8+hadamard" and rotated.parts == 2


def test_unknown_format_names_the_available_ones():
    with pytest.raises(KeyError, match="unknown host dtype 'int4'; available: model, float32, bfloat16"):
        host_format("int4")


@pytest.mark.parametrize("name,token_bytes", [("model", 3 * 16 * 4), ("float32", 3 * 16 * 4),
                                              ("bfloat16", 3 * 16 * 2), ("int8", 3 * (16 + 4)),
                                              ("fp8", 3 * (16 + 4))])
def test_a_history_holds_physical_bytes_and_counts_logical_ones_over_host_and_disk(tmp_path, name, token_bytes):
    engine, disk = Transfers(CPU), DiskTier(tmp_path)
    hist = History(host_max_tokens=16, disk=disk, fmt=host_format(name))
    x = known(4, (2, 3, 40, 16))
    for chunk in (x[:, :, :7], x[:, :, 7:8], x[:, :, 8:]):
        hist.append(chunk, engine)
    fmt = host_format(name)
    assert hist.length == 40 and (hist.disk_length, hist.host_length) == (32, 8)  # two 16-token blocks on disk
    assert hist.disk_bytes == 32 * 2 * token_bytes and hist.host_bytes == 8 * 2 * token_bytes
    assert hist.disk_logical_bytes == 32 * 2 * 3 * 16 * 4 and hist.host_logical_bytes == 8 * 2 * 3 * 16 * 4
    s = engine.stats
    # on CPU the 24 tokens that go from the new ones straight to disk are no D2H copy: 16 of 40 crossed
    assert (s.d2h_bytes, s.d2h_logical_bytes) == (16 * 2 * token_bytes, 16 * 2 * 3 * 16 * 4)
    assert (s.disk_write_bytes, s.disk_write_logical_bytes) == (32 * 2 * token_bytes, 32 * 2 * 3 * 16 * 4)
    back = hist.view(engine)
    assert torch.equal(back, fmt.decode(fmt.encode(x), torch.float32))
    assert s.disk_read_logical_bytes == 32 * 2 * 3 * 16 * 4
    # a batch reorder moves the stored parts as they are (no second rounding)
    hist.map_batch(lambda t: t[[1, 0]], engine)
    assert torch.equal(hist.view(engine), back[[1, 0]])
    tail = hist.pop_tail(3, engine)
    assert torch.equal(hist.decode(tail), back[[1, 0]][:, :, -3:]) and hist.length == 37
    disk.close()


def tiny_decode(model, cache, n=8):
    prompts = [list(range(5, 25)), list(range(30, 41))]
    ids, mask = left_pad(prompts, pad_id=0)
    out, _, _ = greedy_decode(model, ids, mask, cache, n, lambda: 0.0)
    return out


@pytest.mark.parametrize("kind,options", [("full", {}), ("hierarchical", {"window": 4}),
                                          ("dynamic", {"min_window": 0, "max_window": 8})])
def test_float32_host_tiers_keep_the_ids_and_int8_moves_under_a_third_of_the_bytes(tiny_model, kind, options):
    model = tiny_model.model
    ref = tiny_decode(model, DynamicCache(config=model.config))
    exact = MODES[kind].factory(model.config, CPU, {**MODES[kind].defaults, **options, "host_dtype": "float32"},
                                None, {"disk_dir": None, "disk_page_cache": False})
    assert tiny_decode(model, exact).tolist() == ref.tolist()
    int8 = MODES[kind].factory(model.config, CPU, {**MODES[kind].defaults, **options, "host_dtype": "int8"},
                               None, {"disk_dir": None, "disk_page_cache": False})
    tiny_decode(model, int8)
    fp32, q = exact.engine.stats, int8.engine.stats
    # the same tokens cross the link; int8 moves head_dim + 4 bytes per token and head where float32 moves 4 × 16
    assert (q.h2d_logical_bytes, q.d2h_logical_bytes) == (fp32.h2d_bytes, fp32.d2h_bytes) and fp32.h2d_bytes > 0
    assert q.h2d_bytes / fp32.h2d_bytes == q.d2h_bytes / fp32.d2h_bytes == (16 + 4) / (16 * 4)
    assert int8.host_logical_peak_bytes == exact.host_peak_bytes
    assert int8.host_peak_bytes * 16 * 4 == exact.host_peak_bytes * (16 + 4)
    assert int8.stored_peak_bytes == exact.stored_peak_bytes  # logical: it still equals the analytic KV


def test_mode_options_name_the_formats_and_refuse_an_unused_host_dtype():
    full = MODES["full"].options
    assert full(kind="full", host_dtype="int8", k_dtype="bfloat16").host_formats == ("bfloat16", "int8")
    assert full(kind="full", host_dtype="fp8").label == "full(host_dtype=fp8)"
    with pytest.raises(ValueError, match="host_dtype is unused when k_dtype and v_dtype are both given"):
        full(kind="full", host_dtype="int8", k_dtype="int8", v_dtype="fp8")
    with pytest.raises(ValueError, match="Input should be 'model', 'float32', 'bfloat16', 'float16', 'int8' or"):
        full(kind="full", host_dtype="int4")
