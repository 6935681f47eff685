"""The offload modes kvbench can run: one :class:`ModeInfo` per mode in :data:`MODES`.

An entry holds everything kvbench knows of a mode: its options (a strict pydantic model whose ``kind`` is the
mode's name: the scenario schema's union of modes is built from these), their defaults (written once, in the
model), what it needs (CUDA, a host tier), the placement ``kvbench plan`` predicts for it and the factory of its
cache. Adding a mode is adding its entry here (and its tests).

Plain data and pydantic (no torch import) so that `kvbench validate` and `kvbench list modes` stay fast; the
factories import the caches (and torch) when called, through :func:`make_cache`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from kvbench.offload.architecture import Architecture
from kvbench.offload.policy import MIN_WINDOW
from kvbench.offload.registry import Registry

if TYPE_CHECKING:
    import torch

#: Windows under this many tokens make ``kvbench validate`` warn: every step moves most of the history (churn).
SMALL_WINDOW_TOKENS = 256

#: Tokens of a prompt, a window or of new tokens: 16,777,216 (2^24), above any model's context.
MAX_TOKENS = 2**24
#: Tokens of a host-memory cap (a batch's worth of histories): 2^32.
MAX_HOST_TOKENS = 2**32


def whole_number(lo: int, hi: int) -> Any:
    """A strict whole number from ``lo`` to ``hi`` (a lower bound of 1 reads "greater than 0")."""
    low = {"gt": 0} if lo == 1 else {"ge": lo}
    return Annotated[int, Field(strict=True, le=hi, **low)]


Tokens = whole_number(1, MAX_TOKENS)
TokensOrZero = whole_number(0, MAX_TOKENS)
HostTokens = whole_number(1, MAX_HOST_TOKENS)


class ModeOptions(BaseModel):
    """A mode as a scenario gives it: ``kind`` (the mode's name) and its options; strict (unknown keys are
    errors) and frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str

    @property
    def options(self) -> dict[str, Any]:
        """The mode's options (everything but ``kind``)."""
        return self.model_dump(exclude={"kind"})

    @property
    def label(self) -> str:
        """``kind`` plus its options, e.g. ``hierarchical(window=512)``: unique within a scenario."""
        opts = ",".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        return f"{self.kind}({opts})" if opts else self.kind


_HOST_CAP = "Tokens kept in host memory; older ones spill to disk."

#: The host tier's formats (:data:`kvbench.offload.host_tiers.HOST_DTYPES`, which says what each keeps).
HostDtype = Literal["model", "float32", "bfloat16", "float16", "int8", "fp8"]


class HostTierOptions(ModeOptions):
    """The host tier's format, for the modes that keep history off the device: K and V as the model's dtype
    (default), another float dtype, or quantized (int8, fp8) with one scale per token and head; the device keeps
    the model's dtype. See :mod:`kvbench.offload.host_tiers`."""

    host_dtype: HostDtype | None = Field(None, description="The format of K and V in the host and disk tiers and "
                                         "on the link: model (default) | float32 | bfloat16 | float16 | int8 | fp8.")
    k_dtype: HostDtype | None = Field(None, description="The keys' format, over host_dtype (keys are the more "
                                      "sensitive to quantization).")
    v_dtype: HostDtype | None = Field(None, description="The values' format, over host_dtype.")
    hadamard: StrictBool | None = Field(None, description="true: rotate K and V by a Hadamard matrix before "
                                        "they are encoded (spreads outlier channels; head_dim a power of two).")

    @model_validator(mode="after")
    def _host_formats(self) -> HostTierOptions:
        if self.host_dtype is not None and self.k_dtype is not None and self.v_dtype is not None:
            raise ValueError("host_dtype is unused when k_dtype and v_dtype are both given: drop one")
        return self

    @property
    def host_formats(self) -> tuple[str, str]:
        """(K's, V's) host format names."""
        return (self.k_dtype or self.host_dtype or "model", self.v_dtype or self.host_dtype or "model")


class NoneMode(ModeOptions):
    """No offload: transformers DynamicCache, the baseline."""

    kind: Literal["none"] = Field(description="Mode name.")


class HfOffloadedMode(ModeOptions):
    """transformers' own DynamicCache(offloading=True); needs CUDA."""

    kind: Literal["hf-offloaded"] = Field(description="Mode name.")


class FullMode(HostTierOptions):
    """All history in the host tier, layers prefetched to the device."""

    kind: Literal["full"] = Field(description="Mode name.")
    host_max_tokens: HostTokens | None = Field(None, description=_HOST_CAP)


class HierarchicalMode(HostTierOptions):
    """The last `window` tokens of every layer on the device, older ones on the host."""

    kind: Literal["hierarchical"] = Field(description="Mode name.")
    window: TokensOrZero = Field(description="Tokens per layer kept on the device (what offload tutorials call "
                                             "gpu_cache_size).")
    host_max_tokens: HostTokens | None = Field(None, description=_HOST_CAP)


class DynamicMode(HostTierOptions):
    """A window chosen each step from the budget and measured transfer and compute time."""

    kind: Literal["dynamic"] = Field(description="Mode name.")
    min_window: TokensOrZero = Field(MIN_WINDOW, description="Smallest window in tokens while the budget allows it.")
    max_window: Tokens | None = Field(None, description="Largest window in tokens (default: only the budget).")
    host_max_tokens: HostTokens | None = Field(None, description=_HOST_CAP)

    @model_validator(mode="after")
    def _bounds(self) -> DynamicMode:
        if self.max_window is not None and self.min_window > self.max_window:
            raise ValueError(f"min_window {self.min_window} is larger than max_window {self.max_window}")
        return self


#: ``rule(shape, tokens, dtype_bytes, window) -> (device bytes, host bytes)`` of one sequence's KV at ``tokens``.
Placement = Callable[[Architecture, int, int, int], tuple[int, int]]


def _all_on_device(shape: Architecture, tokens: int, dtype_bytes: int, window: int) -> tuple[int, int]:
    return shape.kv_bytes(tokens, dtype_bytes), 0


def _history_on_host(shape: Architecture, tokens: int, dtype_bytes: int, window: int) -> tuple[int, int]:
    """The last ``window`` tokens of each full-attention layer on the device, plus two layers' older history
    (the one computing, the one prefetched); that older history in host memory; sliding layers on the device."""
    per_layer, n_full = shape.token_layer_bytes(dtype_bytes), shape.full_layers
    w = min(window, tokens)
    return (shape.sliding_kv_bytes(tokens, dtype_bytes) + n_full * per_layer * w
            + min(2, n_full) * per_layer * (tokens - w), n_full * per_layer * (tokens - w))


def _no_window(shape: Architecture, tokens: int, dtype_bytes: int, window: int) -> tuple[int, int]:
    return _history_on_host(shape, tokens, dtype_bytes, 0)


#: ``factory(config, device, options, budget_bytes, disk) -> cache``: ``options`` the mode's options over their
#: defaults, ``disk`` the keywords ``disk_dir`` and ``disk_page_cache`` of the disk tier.
Factory = Callable[[Any, Any, dict[str, Any], int | None, dict[str, Any]], Any]


def _dynamic_cache(config: Any, device: Any, options: dict[str, Any], budget_bytes: int | None,
                   disk: dict[str, Any]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=config)


def _hf_offloaded_cache(config: Any, device: Any, options: dict[str, Any], budget_bytes: int | None,
                        disk: dict[str, Any]) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=config, offloading=True)


def host_formats(options: dict[str, Any]) -> Any:
    """The (K, V) host formats the options name (:func:`kvbench.offload.host_tiers.host_format`), or None for the
    model's dtype unrotated. Raises ValueError where torch lacks fp8."""
    k = options.get("k_dtype") or options.get("host_dtype")
    v = options.get("v_dtype") or options.get("host_dtype")
    if not (k or v or options.get("hadamard")):
        return None
    from kvbench.offload.host_tiers import host_format

    return host_format(k, bool(options.get("hadamard"))), host_format(v, bool(options.get("hadamard")))


def _full_cache(config: Any, device: Any, options: dict[str, Any], budget_bytes: int | None,
                disk: dict[str, Any]) -> Any:
    from kvbench.offload.caches import FullOffloadCache

    return FullOffloadCache(config, device, host_max_tokens=options["host_max_tokens"],
                            host_formats=host_formats(options), **disk)


def _hierarchical_cache(config: Any, device: Any, options: dict[str, Any], budget_bytes: int | None,
                        disk: dict[str, Any]) -> Any:
    from kvbench.offload.caches import HierarchicalCache

    return HierarchicalCache(config, device, window=options["window"], host_max_tokens=options["host_max_tokens"],
                             host_formats=host_formats(options), **disk)


def _window_policy_cache(config: Any, device: Any, options: dict[str, Any], budget_bytes: int | None,
                         disk: dict[str, Any]) -> Any:
    from kvbench.offload.caches import DynamicOffloadCache

    return DynamicOffloadCache(config, device, min_window=options["min_window"], max_window=options["max_window"],
                               budget_bytes=budget_bytes, host_max_tokens=options["host_max_tokens"],
                               host_formats=host_formats(options), **disk)


@dataclass(frozen=True)
class ModeInfo:
    """One registered offload mode.

    Attributes:
        kind: the name used in a scenario's ``modes: [{kind: ...}]``.
        summary: one line on what stays on the device.
        options: the mode's options model (``kind`` and the options, with their defaults and bounds).
        factory: builds a fresh cache (see :data:`Factory`); called by :func:`make_cache`.
        needs_cuda: the mode cannot run without a CUDA device; elsewhere its trials are recorded as
            ``skipped`` with ``skip_reason``.
        skip_reason: why the mode is skipped without CUDA (the error it would raise).
        host_tier: the mode is one of kvbench's offload caches (a host tier, optional disk tier, own accounting).
        placement: where ``kvbench plan`` and the run's predictions put one sequence's KV (see :data:`Placement`),
            or None for a mode they do not model (``dynamic`` moves its window, ``hf-offloaded`` is transformers').
    """

    kind: str
    summary: str
    options: type[ModeOptions]
    factory: Factory
    needs_cuda: bool = False
    skip_reason: str = ""
    host_tier: bool = False
    placement: Placement | None = None

    @property
    def defaults(self) -> dict[str, Any]:
        """The options that have a default, with it (an option without one, like ``window``, must be given)."""
        return {k: f.default for k, f in self.options.model_fields.items() if k != "kind" and not f.is_required()}


MODES: Registry[ModeInfo] = Registry("mode", (
    (m.kind, m) for m in (
        ModeInfo("none", "everything on the device: transformers DynamicCache, the baseline for every ratio",
                 NoneMode, _dynamic_cache, placement=_all_on_device),
        ModeInfo("hf-offloaded", "transformers' own DynamicCache(offloading=True): ~1-2 layers on the device",
                 HfOffloadedMode, _hf_offloaded_cache, needs_cuda=True,
                 skip_reason="hf-offloaded needs a CUDA device: on CPU-only torch DynamicCache(offloading=True) "
                 "raises AssertionError: Torch not compiled with CUDA enabled"),
        ModeInfo("full", "the layer being computed + the one being prefetched; all history on the host",
                 FullMode, _full_cache, host_tier=True, placement=_no_window),
        ModeInfo("hierarchical", "the last `window` tokens of every layer; older tokens on the host",
                 HierarchicalMode, _hierarchical_cache, host_tier=True, placement=_history_on_host),
        ModeInfo("dynamic", "a window chosen each step from the budget, grown while transfers stall compute",
                 DynamicMode, _window_policy_cache, host_tier=True),
    )
))


def placement(shape: Architecture, kind: str, tokens: int, dtype_bytes: int, window: int = 0) -> tuple[int, int]:
    """``(device bytes, host bytes)`` of one sequence's KV at ``tokens`` under mode ``kind``'s placement rule
    (``window``: the ``hierarchical`` mode's, tokens per layer kept on the device).

    Raises:
        ValueError: a mode without a placement rule (``dynamic``, ``hf-offloaded``) or not registered.
    """
    rule = MODES[kind].placement if kind in MODES else None
    if rule is None:
        modeled = ", ".join(k for k, m in MODES.items() if m.placement is not None)
        raise ValueError(f"no placement model for mode {kind!r} (only {modeled})")
    return rule(shape, tokens, dtype_bytes, window)


class ModeUnavailable(RuntimeError):
    """The mode cannot run here (e.g. it needs CUDA); the trial is recorded as ``skipped`` with this reason."""


def make_cache(kind: str, config: Any, device: torch.device, *, budget_bytes: int | None = None,
               disk_dir: str | None = None, disk_page_cache: bool = False, **options: Any) -> Any:
    """A fresh, empty cache for one generation, built by the mode's factory (:attr:`ModeInfo.factory`) from its options
    over their defaults.

    Args:
        kind: a registered mode name (see :data:`MODES`).
        config: the model's transformers config (gives layer types, e.g. sliding-window layers).
        device: the device the model runs on.
        budget_bytes: the device KV budget (used by ``dynamic``).
        disk_dir: where a disk tier goes (modes given ``host_max_tokens``).
        disk_page_cache: keep the disk tier in the page cache (see :class:`~kvbench.offload.caches.OffloadedCache`).
        **options: the mode's options (``window``, ``min_window``, ``max_window``, ``host_max_tokens``).

    Raises:
        KeyError: unknown mode, or a required option (``window``) missing. ModeUnavailable: the mode needs CUDA and
            ``device`` is not CUDA. ValueError, DiskTierError: see the cache classes.
    """
    info = MODES[kind]
    if info.needs_cuda and device.type != "cuda":
        raise ModeUnavailable(info.skip_reason)
    return info.factory(config, device, {**info.defaults, **options}, budget_bytes,
                        {"disk_dir": disk_dir, "disk_page_cache": disk_page_cache})

