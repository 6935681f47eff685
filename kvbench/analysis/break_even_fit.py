"""The break-even map's model: the prefill/restore roofline of a request, fitted to measured reuse trials, and its
predictions for cells nobody measured.

A request whose prompt has ``k`` tokens restored (from tier ``j``) and ``n`` prefilled has, in seconds,

    TTFT = overhead + prefill × n + attention × n × (k + n / 2) + Σ_j restore_j × k_j
    TPOT = decode + decode_per_token × (prompt tokens + generated tokens / 2)

(the compute of a forward pass: a per-token part, the weights' matrix products, and the attention of each new
token over the k + i tokens before it, Σ_{i<n} (k + i) ≈ n (k + n / 2); a restore copies each token's KV once, at
the tier's bandwidth; a decode step reads the weights and the context's KV, averaged over the generated tokens:
the roofline of :mod:`kvbench.analysis.plan`). The constants are least squares, each at least 0 (times and costs
cannot be negative: :func:`scipy.optimize.nnls`, the active-set method of Lawson & Hanson, *Solving Least Squares
Problems*, 1974, ch. 23), over the measured trials (cold and warm) of one engine and mode; their 95% intervals are
a percentile bootstrap drawing whole independent units (a prefix's visits:
:func:`kvbench.analysis.reuse.sampling_units`), :data:`N_FIT_BOOT` refits. A restore tier's bandwidth (bytes/s)
is its bytes per token ÷ its seconds per token, where the trials say how many bytes each token restored held
(kvbench's own store; a server's cache does not say).

A fit says what it rests on: the prompt lengths of its trials (:attr:`Fit.prompt_tokens`; a prediction beyond 2x
of that range is an extrapolation: :func:`beyond_range`) and their machine load. :func:`fit_quiet` leaves out the
trials measured while the machine was busy (their times hold the other load too: a tiny-model fit of busy trials
read prefill 265 µs/token where its quietest trials ran at about 12); only where the quiet trials cannot be fitted
are the busy ones, and that fit is marked busy (:attr:`Fit.busy`), never a measurement of the machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from kvbench.analysis.intervals import busy_flags, cluster_draws, load_known
from kvbench.analysis.reuse import sampling_units

#: Refits of the bootstrap over independent units.
N_FIT_BOOT = 400
#: The TTFT constants, in the order of :func:`ttft_features`' columns (restore tiers follow).
TTFT_TERMS = ("overhead_s", "prefill_s_per_token", "attention_s_per_token_pair")
#: The TPOT constants.
TPOT_TERMS = ("decode_s", "decode_s_per_context_token")
#: A prediction at a prompt length more than this factor outside the fitted lengths is an extrapolation.
EXTRAPOLATION_FACTOR = 2
#: Requests per cell up to which a prediction draws every request's residual; beyond, the sum of a side's
#: residuals is drawn from its normal limit (memory and time then do not grow with the cell).
EXACT_NOISE_REQUESTS = 1_000
#: Restore tiers and the columns of bytes restored from them (``cache``: a server's prompt cache, bytes unknown).
TIERS = (("host", "restore_host_bytes"), ("disk", "restore_disk_bytes"), ("cache", None))


def tier_tokens(rows: pd.DataFrame) -> pd.DataFrame:
    """Tokens restored per trial from each tier of :data:`TIERS`: ``tokens_restored`` split by the bytes restored
    from the host and disk tiers (kvbench's store); all of it ``cache`` where no bytes were recorded (a server)."""
    k = pd.to_numeric(rows["tokens_restored"], errors="coerce").fillna(0).to_numpy(float)
    host = pd.to_numeric(rows.get("restore_host_bytes"), errors="coerce") if "restore_host_bytes" in rows else None
    disk = pd.to_numeric(rows.get("restore_disk_bytes"), errors="coerce") if "restore_disk_bytes" in rows else None
    h = host.fillna(0).to_numpy(float) if host is not None else np.zeros(len(rows))
    d = disk.fillna(0).to_numpy(float) if disk is not None else np.zeros(len(rows))
    total = h + d
    known = total > 0
    share = np.divide(h, total, out=np.zeros(len(rows)), where=known)
    return pd.DataFrame({"host": np.where(known, k * share, 0.0), "disk": np.where(known, k * (1 - share), 0.0),
                         "cache": np.where(known, 0.0, k)}, index=rows.index)


def ttft_features(prefilled: np.ndarray, restored: np.ndarray, tiers: np.ndarray) -> np.ndarray:
    """``[n, 3 + tiers]``: 1, n, n × (k + n / 2), then the tokens restored per tier (``tiers`` ``[n, T]``)."""
    n, k = prefilled.astype(float), restored.astype(float)
    return np.column_stack([np.ones_like(n), n, n * (k + n / 2), tiers])


def tpot_features(context: np.ndarray) -> np.ndarray:
    """``[n, 2]``: 1 and the mean context of the decode steps."""
    return np.column_stack([np.ones(len(context)), context.astype(float)])


@dataclass(repr=False)
class Fit:
    """The fitted constants of one engine and mode (seconds, seconds per token, bytes/s).

    Attributes:
        values: constant → its least-squares value (NaN where the trials cannot tell it: a tier never used).
        low, high: constant → its 95% bootstrap interval.
        tiers: the restore tiers the trials used (``restore_<tier>_s_per_token`` are in ``values``).
        draws: constant → its ``N_FIT_BOOT`` bootstrap values (for prediction intervals).
        bandwidth: tier → (bytes/s, low, high) where the trials give bytes per token.
        trials, units: the trials fitted and the independent units they come from; ``runs``: their run folders.
        residual_s: the root mean square TTFT residual; ``residuals``: every trial's e2e residual (seconds: TTFT's
            and the decode steps' together), which a prediction interval draws from.
        prompt_tokens: the shortest and the longest prompt fitted (tokens).
        busy: fitted to trials measured while the machine was busy (no quiet fit was possible): not a
            measurement of the machine. ``busy_left_out``: busy trials left out of a quiet fit;
            ``load_unknown``: fitted trials whose load was not recorded.
    """

    values: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    tiers: list[str]
    draws: dict[str, np.ndarray]
    bandwidth: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    trials: int = 0
    units: int = 0
    runs: list[str] = field(default_factory=list)
    residual_s: float = math.nan
    residuals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    prompt_tokens: tuple[int, int] = (0, 0)
    busy: bool = False
    busy_left_out: int = 0
    load_unknown: int = 0

    def __repr__(self) -> str:  # the draws and residuals are thousands of numbers
        return f"Fit(trials={self.trials}, units={self.units}, values={self.values})"


def fit_constants(rows: pd.DataFrame, n_boot: int = N_FIT_BOOT, seed: int = 0) -> Fit | None:
    """Fit the TTFT and TPOT constants (module docstring) to measured reuse trials of one engine and mode
    (``prompt_tokens``, ``tokens_restored``, ``ttft_s``, ``tpot_s``, ``n_output_tokens``, ``document``,
    ``request_id``; ``restore_host_bytes`` / ``restore_disk_bytes`` where recorded).

    Returns:
        The :class:`Fit`, or None with fewer trials than constants + 2 or fewer than 2 prompt lengths (the per-token
        and per-pair prefill terms cannot be told apart then).
    """
    rows = rows.dropna(subset=["ttft_s", "prompt_tokens"]).reset_index(drop=True)
    tiers_all = tier_tokens(rows)
    tiers = [t for t, _ in TIERS if tiers_all[t].sum() > 0]
    if len(rows) < len(TTFT_TERMS) + len(tiers) + 2 or rows["prompt_tokens"].nunique() < 2:
        return None
    k = pd.to_numeric(rows["tokens_restored"], errors="coerce").fillna(0).to_numpy(float)
    prompt = rows["prompt_tokens"].to_numpy(float)
    x = ttft_features(prompt - k, k, tiers_all[tiers].to_numpy(float))
    y = rows["ttft_s"].to_numpy(float)
    tp = rows.dropna(subset=["tpot_s"])
    xt = tpot_features(tp["prompt_tokens"].to_numpy(float) + tp["n_output_tokens"].to_numpy(float) / 2)
    yt = tp["tpot_s"].to_numpy(float)
    names = list(TTFT_TERMS) + [f"restore_{t}_s_per_token" for t in tiers]
    beta, beta_t = nnls(x, y)[0], nnls(xt, yt)[0] if len(tp) >= 2 else np.full(2, math.nan)
    units = sampling_units(rows)[0] if "document" in rows else pd.Series(np.arange(len(rows)), index=rows.index)
    counts, index = cluster_draws(units, n_boot, seed)
    t_index = index[np.isin(rows.index, tp.index)]
    boots, boots_t = [], []
    for c in counts:  # each refit weighs every trial by how often its unit was drawn
        w = c[index].astype(float)
        if w.sum() == 0:
            continue
        sw = np.sqrt(w)
        boots.append(nnls(x * sw[:, None], y * sw)[0])
        wt = np.sqrt(c[t_index].astype(float))
        boots_t.append(nnls(xt * wt[:, None], yt * wt)[0] if len(tp) >= 2 else np.full(2, math.nan))
    b, bt = np.array(boots), np.array(boots_t)
    values = dict(zip(names + list(TPOT_TERMS), [*beta, *beta_t]))
    draws = dict(zip(names + list(TPOT_TERMS), [*b.T, *bt.T]))
    low = {n: float(np.quantile(d, 0.025)) for n, d in draws.items()}
    high = {n: float(np.quantile(d, 0.975)) for n, d in draws.items()}
    bandwidth = {}
    for tier, col in TIERS:
        if col is None or tier not in tiers:
            continue
        per_token = float(pd.to_numeric(rows[col], errors="coerce").sum() / tiers_all[tier].sum())
        name = f"restore_{tier}_s_per_token"

        # bytes/s of one token's bytes in ``seconds``; inf for 0 s
        def rate(seconds: float, per_token: float = per_token) -> float:
            return per_token / seconds if seconds > 0 else math.inf

        # bytes/s falls as s/token rises: the interval's ends swap
        bandwidth[tier] = (rate(values[name]), rate(high[name]), rate(low[name]))
    runs = sorted(rows["run_path"].astype(str).unique()) if "run_path" in rows else []
    n_out = pd.to_numeric(rows["n_output_tokens"], errors="coerce").to_numpy(float)
    ctx = prompt + n_out / 2
    e2e_model = x @ beta + (n_out - 1) * (beta_t[0] + beta_t[1] * ctx)
    e2e = pd.to_numeric(rows["e2e_s"], errors="coerce").to_numpy(float) if "e2e_s" in rows else np.full(len(rows),
                                                                                                        np.nan)
    resid = e2e - e2e_model
    return Fit(values, low, high, tiers, draws, bandwidth, len(rows), int(units.nunique()), runs,
               float(np.sqrt(np.mean((x @ beta - y) ** 2))), resid[np.isfinite(resid)],
               (int(prompt.min()), int(prompt.max())))


def fit_quiet(rows: pd.DataFrame, n_boot: int = N_FIT_BOOT, seed: int = 0) -> Fit | None:
    """:func:`fit_constants` of the trials not measured on a busy machine (``machine_busy`` True: left out and
    counted in ``busy_left_out``; a trial whose load is unknown stays in, counted in ``load_unknown``). Where
    those cannot be fitted but all the trials can, the fit of all of them, marked ``busy``. None when neither
    can be fitted."""
    busy = busy_flags(rows["machine_busy"]) if "machine_busy" in rows else pd.Series(False, index=rows.index)
    fit = fit_constants(rows[~busy], n_boot, seed)
    if fit is not None:
        fit.busy_left_out = int(busy.sum())
    elif busy.any():
        fit = fit_constants(rows, n_boot, seed)
        if fit is not None:
            fit.busy = True
    if fit is not None:
        fitted = rows if fit.busy else rows[~busy]
        fit.load_unknown = int((~load_known(fitted["machine_busy"])).sum()) if "machine_busy" in fitted \
            else len(fitted)
    return fit


def beyond_range(prompt_tokens: tuple[int, int], lengths: list[int] | tuple[int, ...]) -> list[int]:
    """The prompt ``lengths`` (tokens) more than :data:`EXTRAPOLATION_FACTOR` times outside the fitted range
    ``prompt_tokens`` (shortest, longest): below shortest ÷ 2 or above longest × 2; sorted, each once. Empty
    for a range of (0, 0) (not recorded)."""
    low, high = prompt_tokens
    if high <= 0:
        return []
    return sorted({int(n) for n in lengths if n < low / EXTRAPOLATION_FACTOR or n > high * EXTRAPOLATION_FACTOR})


@dataclass(frozen=True)
class CellShape:
    """What a cell's requests look like, for :func:`predict_saving`: ``prompt_tokens``, ``prefix_tokens`` (shared),
    ``visits`` per prefix and ``prefixes`` of them, ``restored_share`` (tokens restored by a revisit ÷ its shared
    prefix, as measured at the same working set) split over ``tier_share`` (tier → share of the restored tokens),
    ``n_output`` tokens per request, and the memory charged beside the device (``host_bytes``, ``disk_bytes``)."""

    prompt_tokens: int
    prefix_tokens: int
    visits: int
    prefixes: int
    restored_share: float
    tier_share: dict[str, float]
    n_output: int
    host_bytes: float = 0.0
    disk_bytes: float = 0.0


def _e2e(c: dict[str, np.ndarray], tiers: list[str], prompt: int, restored: float, tier_share: dict[str, float],
         n_output: int) -> np.ndarray:
    n = prompt - restored
    ttft = (c["overhead_s"] + c["prefill_s_per_token"] * n + c["attention_s_per_token_pair"] * n * (restored + n / 2)
            + sum(c[f"restore_{t}_s_per_token"] * restored * tier_share.get(t, 0.0) for t in tiers))
    tpot = c["decode_s"] + c["decode_s_per_context_token"] * (prompt + n_output / 2)
    return ttft + (n_output - 1) * tpot


def residual_sums(residuals: np.ndarray, draws: int, n: int, seed: int = 0) -> np.ndarray:
    """``[2, draws]``: per side and draw, the sum of ``n`` residuals (seconds) drawn with replacement from
    ``residuals``; for ``n`` above :data:`EXACT_NOISE_REQUESTS`, drawn from the normal limit of that sum
    (mean n × their mean, standard deviation √n × theirs: the central limit theorem), so that memory stays at
    2 × ``draws`` × :data:`EXACT_NOISE_REQUESTS` numbers however large a cell."""
    rng = np.random.default_rng(seed)
    if n <= EXACT_NOISE_REQUESTS:
        return rng.choice(residuals, size=(2, draws, n)).sum(axis=2)
    return rng.normal(n * residuals.mean(), math.sqrt(n) * residuals.std(), size=(2, draws))


def predict_saving(fit: Fit, shape: CellShape, gpu_per_hour: float, host_per_gib_hour: float = 0.0,
                   disk_per_gib_hour: float = 0.0, seed: int = 0) -> tuple[float, float, float]:
    """The saving (percent) of restoring against recomputing a cell's requests, one at a time, under ``fit``:
    ``(value, low, high)``. Per prefix, the recompute side prefills every visit whole; the restore side the first
    visit whole and each later visit all but ``restored_share × prefix_tokens`` tokens, restored from the tiers in
    ``tier_share``; USD per 1M = hourly price ÷ tokens/s (tokens/s = generated tokens ÷ Σ e2e), the restore side
    charged ``host_bytes`` and ``disk_bytes`` (:meth:`kvbench.analysis.cost.Prices.per_million`).

    The 95% prediction interval is for what a measurement of the cell would give: per bootstrap draw of the
    constants, each of the cell's ``prefixes × visits`` requests on each side gets an e2e residual drawn from the
    fit's (``fit.residuals``, seeded with ``seed``; :func:`residual_sums`), so the interval holds both the constants'
    uncertainty and the noise of a finite cell."""
    restored = shape.restored_share * shape.prefix_tokens
    hourly_w = gpu_per_hour + (host_per_gib_hour * shape.host_bytes + disk_per_gib_hour * shape.disk_bytes) / 2**30
    n = shape.prefixes * shape.visits

    def e2e_sums(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        whole = _e2e(c, fit.tiers, shape.prompt_tokens, 0.0, {}, shape.n_output)
        part = _e2e(c, fit.tiers, shape.prompt_tokens, restored, shape.tier_share, shape.n_output)
        return n * whole, shape.prefixes * (whole + (shape.visits - 1) * part)

    def saving(cold: np.ndarray, warm: np.ndarray) -> np.ndarray:
        return 100 * (1 - (hourly_w * warm) / (gpu_per_hour * cold))  # tokens are the same on both sides

    with np.errstate(all="ignore"):  # constants of 0 or 1e308 (a hand-made file): NaN, said as no prediction
        cold, warm = e2e_sums({k: np.asarray(v) for k, v in fit.values.items()})
        point = saving(cold, warm)
        cold_d, warm_d = e2e_sums(fit.draws)
        if len(fit.residuals):
            noise = residual_sums(fit.residuals, len(cold_d), n, seed)
            cold_d, warm_d = cold_d + noise[0], warm_d + noise[1]
        draws = saving(cold_d, warm_d)
    draws = draws[np.isfinite(draws)]
    if not np.isfinite(point) or not len(draws):
        return math.nan, math.nan, math.nan
    return float(point), float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))


__all__ = ["CellShape", "EXACT_NOISE_REQUESTS", "EXTRAPOLATION_FACTOR", "Fit", "N_FIT_BOOT", "TIERS", "TPOT_TERMS",
           "TTFT_TERMS", "beyond_range", "fit_constants", "fit_quiet", "predict_saving", "residual_sums",
           "tier_tokens", "tpot_features", "ttft_features"]
