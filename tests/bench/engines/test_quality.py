"""The quality of a lossy host format against `none` (kvbench.bench.engines.quality): KL on constructed
distributions, agreement on constructed ids, teacher forcing, and a run whose threshold turns a mode into "fails
quality" in the report, the recommendation and the cost."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import yaml
from transformers import DynamicCache

import kvbench
from conftest import tiny_scenario
from kvbench.analysis.points import point_table, qualifies
from kvbench.bench.engines.decode import greedy_decode, left_pad
from kvbench.bench.engines.quality import (ServerQuality, agreement, kl_divergence, server_quality, step_logprobs,
                                           topk_kl)
from kvbench.report.advice import findings


def test_kl_divergence_of_constructed_distributions():
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1], [1.0, 0.0], [0.5, 0.5]]).log()
    q = torch.tensor([[0.25, 0.75], [0.9, 0.1], [0.5, 0.5], [1.0, 0.0]]).log()
    kl = kl_divergence(p, q)
    assert kl[0].item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-6)  # 0.1438 nats
    assert kl[1].item() == pytest.approx(0.0, abs=1e-7)
    assert kl[2].item() == pytest.approx(math.log(2), rel=1e-6)  # p's 0 adds nothing, not NaN
    assert kl[3].item() == math.inf  # q gives 0 where p does not


def test_agreement_counts_positions_and_steps_before_the_first_difference():
    assert agreement([[1, 2, 3, 4]], [[1, 2, 9, 4]]) == (0.75, 0.5)
    assert agreement([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [0, 6, 7, 8]]) == (7 / 8, (1.0 + 0.0) / 2)


def test_teacher_forcing_on_a_cache_s_own_greedy_ids_is_its_free_run(tiny_model):
    model = tiny_model.model
    ids, mask = left_pad([list(range(5, 25)), list(range(30, 41))], pad_id=0)
    greedy, _, _ = greedy_decode(model, ids, mask, DynamicCache(config=model.config), 6, lambda: 0.0)
    free_ids, free = step_logprobs(model, ids, mask, DynamicCache(config=model.config), 6)
    forced_ids, forced = step_logprobs(model, ids, mask, DynamicCache(config=model.config), 6, forced=greedy)
    assert free_ids.tolist() == forced_ids.tolist() == greedy.tolist()
    assert free.shape == (2, 6, 49152) and torch.equal(free, forced)
    assert torch.allclose(free.exp().sum(-1), torch.ones(2, 6))


@pytest.mark.e2e
def test_a_threshold_turns_a_lossy_mode_into_fails_quality_and_a_lossless_one_gets_no_quality(tmp_path):
    modes = [{"kind": "none"}, {"kind": "full", "host_dtype": "fp8"}, {"kind": "full", "host_dtype": "float32"}]
    data = tiny_scenario(modes=modes, prompt_tokens=[16], batch_sizes=[2], max_new_tokens=6, repeats=5,
                         quality={"max_kl": 1e-12, "min_agreement": 0.5})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    run = kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res")
    rows = {r["trial_id"].rsplit("-r", 1)[0]: r for r in run.rows if r["repeat"] == 0}
    fp8 = next(r for k, r in rows.items() if "fp8" in k)
    f32 = next(r for k, r in rows.items() if "float32" in k)
    assert 0 < fp8["kl_mean"] <= fp8["kl_max"] < 1e-3 and fp8["token_agreement"] == 1.0
    assert fp8["agreement_to_divergence"] == 1.0
    assert all(f32.get(k) is None for k in ("kl_mean", "token_agreement"))
    # fp8 moves 1 byte + 4 / head_dim of scale per element where float32 moves 4
    assert fp8["h2d_logical_bytes"] == f32["h2d_bytes"] and fp8["h2d_bytes"] * 64 == f32["h2d_bytes"] * 20
    results = kvbench.load_results(run.run_dir)
    table = point_table(results.trials)
    by_mode = table.set_index("mode_label")
    assert by_mode.loc["full(host_dtype=fp8)", "quality_ok"] is False
    assert by_mode.loc["full(host_dtype=float32)", "quality_ok"] is None
    assert by_mode.loc["full(host_dtype=fp8)", "quality"].startswith("fails quality: KL ")
    assert "> max_kl 1e-12" in by_mode.loc["full(host_dtype=fp8)", "quality"]
    assert dict(zip(table["mode_label"], qualifies(table))) == {
        "none": True, "full(host_dtype=fp8)": False, "full(host_dtype=float32)": True}
    lines = findings(table, "tiny")
    assert any("`full(host_dtype=fp8)`" in f and "; fails quality: KL" in f for f in lines)
    costs = kvbench.cost_report(results, tmp_path / "cost", kvbench.Prices(gpu_per_hour=2.0))
    why = dict(zip(costs.table["mode_label"], costs.table["why"]))
    assert why["full(host_dtype=fp8)"].startswith("fails quality: KL")


def test_a_lossy_mode_s_kv_store_holds_its_format(tiny_model):
    from kvbench.bench.engines.transformers import make_store, store_token_bytes
    from kvbench.scenario import parse_scenario

    s = parse_scenario(tiny_scenario(), "s.yaml")
    shape = tiny_model.shape
    logical = store_token_bytes(shape, torch.float32)
    assert logical == shape.sequence_bytes_per_token(4)
    int8 = store_token_bytes(shape, torch.float32, {"host_dtype": "int8"})
    assert int8 * shape.head_dim * 4 == logical * (shape.head_dim + 4)  # head_dim + 4 bytes where 4 × head_dim
    store = make_store(s, shape, torch.float32, {"host_dtype": "int8"})
    keys = [torch.randn(shape.kv_heads, 5, shape.head_dim) for _ in range(shape.layers)]
    store.put(list(range(5)), keys, keys)
    assert store.host_bytes == 5 * int8 and [f.name for f in store.formats] == ["int8", "int8"]
    store.close()


def test_top_k_kl_of_constructed_distributions():
    ln = math.log
    # the same top-2 and the same rest: 0
    assert topk_kl({1: ln(0.5), 2: ln(0.3)}, {1: ln(0.5), 2: ln(0.3)}) == pytest.approx(0.0, abs=1e-12)
    # p = (0.5, 0.3, rest 0.2), q = (0.4, 0.4, rest 0.2): Σ p log p/q over the three bins
    want = 0.5 * ln(0.5 / 0.4) + 0.3 * ln(0.3 / 0.4)
    assert topk_kl({1: ln(0.5), 2: ln(0.3)}, {1: ln(0.4), 2: ln(0.4)}) == pytest.approx(want, rel=1e-9)
    # only token 1 is listed by both: bins {1} and the rest, p = (0.5, 0.5), q = (0.6, 0.4)
    want = 0.5 * ln(0.5 / 0.6) + 0.5 * ln(0.5 / 0.4)
    assert topk_kl({1: ln(0.5), 2: ln(0.3)}, {1: ln(0.6), 3: ln(0.1)}) == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match="needs the log-probabilities of both"):
        topk_kl({}, {1: 0.0})


def test_top_k_kl_of_whole_vocabularies_is_the_kl_not_infinite():
    """llama-server returns its whole vocabulary when n_probs is larger: both maps then cover the distribution,
    and the float sums leave p a rest of 1e-16 where q's is 0 (a stand-in for an unlisted token made this
    infinite)."""
    ln = math.log
    p, q = [0.6, 0.3, 0.1], [0.5, 0.3, 0.2]
    want = sum(a * ln(a / b) for a, b in zip(p, q))  # 0.0401 nats
    got = topk_kl({i: ln(v) for i, v in enumerate(p)}, {i: ln(v) for i, v in enumerate(q)})
    assert got == pytest.approx(want, rel=1e-9) and want == pytest.approx(0.0400782, rel=1e-5)


def test_top_k_kl_is_never_above_the_full_kl():
    """On 2,000 constructed pairs of distributions over 12 tokens, each given as its top 1 to 11: the top-k KL
    is at most the KL over the whole vocabulary (the data-processing inequality), and equals it where both top-k
    are the whole vocabulary."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        p, q = (rng.dirichlet(np.full(12, 0.3)) + 1e-12 for _ in range(2))
        p, q = p / p.sum(), q / q.sum()
        full = float(np.sum(p * np.log(p / q)))
        k = int(rng.integers(1, 12))
        assert topk_kl(_top(p, k), _top(q, k)) <= full + 1e-9
        assert topk_kl(_top(p, 12), _top(q, 12)) == pytest.approx(full, rel=1e-6, abs=1e-9)


def _top(d: np.ndarray, k: int) -> dict[int, float]:
    """The top-``k`` log-probabilities of the distribution ``d`` as a server gives them (token id → log p)."""
    return {int(i): float(np.log(d[i])) for i in np.argsort(-d)[:k]}


def test_server_quality_compares_steps_up_to_the_first_differing_id_and_needs_a_none_reply():
    ln = math.log
    same, other = {1: ln(0.9)}, {1: ln(0.6)}
    q = server_quality([1, 1, 1, 1], [same] * 4, [1, 1, 2, 1], [same, other, other, other])
    # steps 0, 1, 2 are conditioned on the same prefix (step 2 differs); step 3 is not compared
    kl_other = topk_kl(same, other)
    assert q == {"token_agreement": 0.75, "agreement_to_divergence": 0.5,
                 "kl_mean": pytest.approx(2 * kl_other / 3), "kl_max": pytest.approx(kl_other)}
    quality, notes = ServerQuality(lossy_run=True), {}
    assert quality.request == {"n_probs": 1000}
    assert quality.fields("p", reference=False, lossy=True, ids=[1], top=[same], notes=notes) == {}
    assert notes == {"kl_mean": "no `none` reply to this prompt in this process (a resumed run) to compare with"}
    assert quality.fields("p", reference=True, lossy=False, ids=[1], top=[same], notes={}) == {}
    got = quality.fields("p", reference=False, lossy=True, ids=[1], top=[other], notes={})
    assert got["kl_mean"] == pytest.approx(kl_other)
    assert got["kl_method"] == ("lower bound from the top-1,000 log-probabilities (n_probs), steps up to the first "
                                "differing id")
    assert ServerQuality(lossy_run=False).request == {}


def test_a_lossless_reuse_presets_reply_gets_its_own_kl_as_the_floor():
    """prefix-cache reuses f16 KV losslessly, but its cached and recomputed prompts are not bit-identical: its
    reply gets the same KL as a lossy preset's, as floor_kl_mean / floor_kl_max, with no quality columns (it is
    checked by its ids, not gated)."""
    ln = math.log
    ref = {1: ln(0.9), 2: ln(0.05)}
    mine = {1: ln(0.8), 2: ln(0.1)}
    want = 0.9 * ln(0.9 / 0.8) + 0.05 * ln(0.05 / 0.1) + 0.05 * ln(0.05 / 0.1)  # bins 1, 2, rest
    quality = ServerQuality(lossy_run=True)
    quality.fields("p", reference=True, lossy=False, ids=[1, 1], top=[ref, ref], notes={})
    got = quality.fields("p", reference=False, lossy=False, ids=[1, 1], top=[ref, mine], notes={}, floor=True)
    assert got == {"floor_kl_mean": pytest.approx(want / 2), "floor_kl_max": pytest.approx(want),
                   "kl_method": ServerQuality.METHOD}
    notes = {}
    assert quality.fields("q", reference=False, lossy=False, ids=[1], top=[ref], notes=notes, floor=True) == {}
    assert notes == {"floor_kl_mean": "no `none` reply to this prompt in this process (a resumed run) to compare "
                                      "with"}
