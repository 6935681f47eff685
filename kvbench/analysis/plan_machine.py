"""The machine ``kvbench plan`` prices a model on: a GPU or node preset (:mod:`kvbench.models.gpus`), each figure
replaceable by one given, and where each figure comes from. Host memory comes from what is given or the node
preset, never from the machine plan runs on; a link measured by ``kvbench env`` counts only for the GPU it was
measured on."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.errors import BadParameter
from kvbench.models.gpus import GPUS, GpuPreset, gpu_preset, measured_here

#: The most GPUs a tensor-parallel group takes (a 72-GPU NVLink domain is the largest sold).
MAX_TP = 72


@dataclass(frozen=True)
class Machine:
    """One GPU's figures and the node's host memory for the model, each with its source (``preset``: the GPU
    preset's datasheet, ``given``, or a measurement).

    Attributes:
        gpu: the preset; tp: GPUs of one tensor-parallel group (the model is split over them).
        gpu_bytes, hbm_gbps, tflops, link_gbps: one GPU's memory (bytes), its bandwidth (GB/s), dense TFLOP/s
            and host link per direction (GB/s).
        host_bytes: host memory for this model's KV (bytes), None when neither given nor in the preset: the
            node's, shared by its ``gpus_per_node ÷ tp`` copies of the model.
        sources: per figure name (``gpu_mem``, ``hbm_gbps``, ``tflops``, ``link_gbps``, ``host_mem``), where it
            comes from.
    """

    gpu: GpuPreset
    tp: int
    gpu_bytes: int
    hbm_gbps: float
    tflops: float
    link_gbps: float
    host_bytes: int | None
    sources: dict[str, str]


def machine(gpu: str, tp: int, gpu_bytes: int | None, hbm_gbps: float | None, tflops: float | None,
            link_gbps: float | None, host_bytes: int | None,
            link_probe: tuple[float, str] | None = None) -> Machine:
    """The :class:`Machine` of preset ``gpu`` with ``tp`` GPUs per model; a figure given (not None) replaces the
    preset's. ``link_probe``: the last ``(GB/s, "measured by kvbench env … on <GPU name>")``, used when no link is
    given and its GPU name matches the preset (:func:`~kvbench.models.gpus.measured_here`).

    Raises:
        BadParameter: an unknown preset (``gpu``), ``tp`` below 1, above :data:`MAX_TP` or above the node's GPUs
            (``tp``), or a bandwidth or TFLOP/s that is not a finite number above 0 (its argument).
    """
    preset = gpu_preset(gpu)
    if isinstance(tp, bool) or not isinstance(tp, int):
        raise BadParameter(f"{{tp}} must be a whole number of GPUs, not {tp!r}", "tp")
    most = preset.gpus_per_node if preset.gpus_per_node > 1 else MAX_TP
    if not 1 <= tp <= most:
        where = f"a {preset.name} node has {most} GPUs" if preset.gpus_per_node > 1 else f"at most {MAX_TP}"
        raise BadParameter(f"{{tp}} {tp}: 1 to {most} GPUs ({where})", "tp")
    for name, v in (("link_gbps", link_gbps), ("hbm_gbps", hbm_gbps), ("tflops", tflops)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            unit = "TFLOP/s" if name == "tflops" else "GB/s"
            raise BadParameter(f"{{{name}}} must be a finite number of {unit} above 0, not {v}", name)
    sources = {"gpu_mem": "preset", "hbm_gbps": "preset", "tflops": "preset",
               "link_gbps": f"{preset.link}, theoretical"}
    if link_gbps is not None:
        sources["link_gbps"] = "given"
    elif link_probe is not None and measured_here(preset, link_probe[1]):
        link_gbps, sources["link_gbps"] = link_probe
    elif link_probe is not None:
        sources["link_gbps"] += f"; the last kvbench env ({link_probe[1]}) is another GPU's: not used"
    for name, v in (("gpu_mem", gpu_bytes), ("hbm_gbps", hbm_gbps), ("tflops", tflops)):
        if v is not None:
            sources[name] = "given"
    if host_bytes is not None:
        sources["host_mem"] = "given"
    elif preset.host_gib is not None and tp > preset.gpus_per_node:  # a model over several nodes (GH200s)
        nodes = -(-tp // preset.gpus_per_node)
        host_bytes = int(preset.host_gib * 2**30) * nodes
        sources["host_mem"] = f"{preset.host_source}, × {nodes} of them for the model's {tp} GPUs"
    elif preset.host_gib is not None:
        copies = preset.gpus_per_node // tp
        host_bytes = int(preset.host_gib * 2**30) // copies
        share = f", ÷ {copies} copies of the model on its {preset.gpus_per_node} GPUs" if copies > 1 else ""
        sources["host_mem"] = f"{preset.host_source}{share}"
    else:
        nodes = ", ".join(n for n, g in GPUS.items() if g.host_gib is not None)
        sources["host_mem"] = f"not given: give the host memory, or a node preset ({nodes})"
    return Machine(preset, tp, gpu_bytes if gpu_bytes is not None else int(preset.hbm_gib * 2**30),
                   hbm_gbps if hbm_gbps is not None else preset.hbm_tbps * 1000,
                   tflops if tflops is not None else preset.bf16_tflops,
                   link_gbps if link_gbps is not None else preset.link_gbps, host_bytes, sources)


__all__ = ["MAX_TP", "Machine", "machine"]
