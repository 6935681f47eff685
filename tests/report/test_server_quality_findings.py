"""A server run's quality findings: a lossy preset's KL is shown as a lower bound beside the lossless reuse
preset's own KL (the floor), and its agreement as the first differing step with the share of steps before it."""

from __future__ import annotations

from kvbench.report.server_findings import server_findings
from kvbench.results.frame import trials_frame

METHOD = "lower bound from the top-1,000 log-probabilities (n_probs), steps up to the first differing id"


def quality_rows() -> list[dict]:
    """Four conversations × turn 2 of llama.cpp's none, prefix-cache and kv-q8_0, 16 tokens each: prefix-cache
    has its own KL against none (floor_kl_mean); kv-q8_0 its KL and ids that first differ at steps 2, 4 and 12
    (one request never differs)."""
    rows = []
    q8 = [(0.004, 0.02, 2, 2 / 16, 0.5), (0.006, 0.03, 4, 4 / 16, 0.75), (0.002, 0.01, 12, 12 / 16, 0.9),
          (0.001, 0.004, None, 1.0, 1.0)]
    for mode in ("none", "prefix-cache", "kv-q8_0"):
        for k in range(4):
            row = {"scenario": "s", "mode": mode, "mode_label": mode, "engine": "llama.cpp", "concurrency": 1,
                   "batch_size": 1, "status": "ok", "message": "", "repeat": 0, "run": "r1",
                   "trial_id": f"{mode}-c{k}", "request_id": f"c{k}-t2", "document": f"c{k}", "turn_index": 2,
                   "warm": mode != "none", "prompt_tokens": 600, "n_output_tokens": 16, "ttft_s": 1.0,
                   "e2e_s": 2.0, "tokens_restored": 0 if mode == "none" else 512,
                   "cached_prompt_tokens": 0 if mode == "none" else 512, "reusable_prompt_tokens": 512,
                   "machine_busy": False, "cold_verified": None,
                   "tokens_match": True}
            if mode == "prefix-cache":
                row.update(floor_kl_mean=[0.0017, 0.0009, 0.0021, 0.0012][k], floor_kl_max=0.008, kl_method=METHOD)
            if mode == "kv-q8_0":
                kl, worst, step, before, agree = q8[k]
                row.update(kl_mean=kl, kl_max=worst, first_divergence_step=step, agreement_to_divergence=before,
                           token_agreement=agree, tokens_match=step is None, kl_method=METHOD)
            rows.append(row)
    return rows


def test_a_lossy_presets_kl_is_a_lower_bound_beside_the_floor_with_its_first_differing_step():
    lines = server_findings(trials_frame(quality_rows(), "s"), "s", None, [])
    q8 = next(line for line in lines if line.startswith("`kv-q8_0` (lossy)"))
    # medians: KL (0.002 + 0.004) / 2 = 0.003; floor (0.0012 + 0.0017) / 2 = 0.00145; step median of 2, 4, 12 = 4;
    # share of steps before it: median of 2/16, 4/16, 12/16, 16/16 = 0.5
    assert q8 == ("`kv-q8_0` (lossy): KL(none ‖ mode) ≥ 0.003 nats median over 4 requests (largest ≥ 0.03; "
                  f"{METHOD}; floor: `prefix-cache` (lossless reuse) ≥ 0.00145); first differing id at step 4 "
                  "(median over the 3 requests that differ; 1 of 4 never do); 50% of steps before a request's first "
                  "differing id (median over 4)")
    floor = next(line for line in lines if line.startswith("`prefix-cache` (lossless reuse)"))
    assert floor == ("`prefix-cache` (lossless reuse): KL(none ‖ mode) ≥ 0.00145 nats median over 4 requests "
                     f"(largest ≥ 0.008; {METHOD}): the floor a lossy preset's KL is read against (the server's "
                     "cached and recomputed prompts are not bit-identical)")
    assert not any("equal to `none`'s (median)" in line for line in lines)
