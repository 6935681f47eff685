"""The GPUs and nodes ``kvbench plan --gpu`` prices, each figure from its vendor's datasheet (the preset's
``source`` names it).

What every figure means and what was assumed:

- ``hbm_gib``: device memory. NVIDIA's datasheets give "80GB", "141GB"; the memory is built of binary-sized HBM
  stacks (five 16 GiB stacks on an H100 SXM) and ``nvidia-smi`` shows 81,559 MiB on an H100 80GB, so the figure
  is taken in GiB; the driver keeps a few hundred MiB, inside the 10% plan reserves.
- ``hbm_tbps``: device memory bandwidth, TB/s (10^12 bytes per second), the datasheet's peak.
- ``bf16_tflops``: dense bf16 tensor-core TFLOP/s, *without* sparsity (datasheets print the 2:4-sparse figure,
  twice the dense one, with a footnote; the dense one is half of it).
- ``link_gbps``: host↔device bandwidth per direction, GB/s, theoretical: PCIe Gen5 x16 = 32 GT/s × 16 lanes ×
  128/130 ÷ 8 ≈ 63 GB/s, written 64 (the datasheets' "128GB/s" counts both directions); PCIe Gen4 x16 half that;
  NVLink-C2C (GH200) 900 GB/s both directions, 450 each. A measured copy reaches about 80% of it (``kvbench
  env`` measures yours; ``--link-gbps`` gives it).
- A node preset adds the GPUs per node and the node's host memory (GiB, the datasheet's "2TB" taken as 2 TiB of
  DIMMs); a GPU preset has no host memory: ``plan`` then takes ``--host-mem`` or says "not given", never the
  memory of the machine it runs on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from kvbench.errors import BadParameter
from kvbench.offload.registry import Registry


@dataclass(frozen=True)
class GpuPreset:
    """One GPU's figures (see the module docstring for units and assumptions).

    Attributes:
        name: the preset's name (``--gpu``); label: the product as the vendor names it.
        hbm_gib: device memory, GiB; hbm_tbps: its bandwidth, TB/s; bf16_tflops: dense bf16 TFLOP/s.
        link_gbps: host↔device GB/s per direction; link: what that link is (``PCIe Gen5 x16``).
        nvml_names: regular expressions matching the name NVML (``nvidia-smi``) gives this GPU: a ``kvbench env``
            link measurement counts for this preset only when its GPU's name matches.
        source: the datasheet each figure comes from.
        gpus_per_node: GPUs in the node (1 for a GPU preset); host_gib: the node's host memory, GiB, or None.
        host_source: where ``host_gib`` comes from.
    """

    name: str
    label: str
    hbm_gib: float
    hbm_tbps: float
    bf16_tflops: float
    link_gbps: float
    link: str
    nvml_names: tuple[str, ...]
    source: str
    gpus_per_node: int = 1
    host_gib: float | None = None
    host_source: str = ""


_H100 = GpuPreset("h100", "NVIDIA H100 SXM5 80GB", 80, 3.35, 989, 64, "PCIe Gen5 x16", (r"\bH100 80GB HBM3\b",
                  r"\bH100 SXM"), "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 80GB, 3.35TB/s, BF16 1,979 "
                  "TFLOPS with sparsity, PCIe Gen5 128GB/s)")
_H200 = GpuPreset("h200", "NVIDIA H200 SXM 141GB", 141, 4.8, 989, 64, "PCIe Gen5 x16", (r"\bH200\b",),
                  "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 141GB HBM3e, 4.8TB/s, BF16 1,979 TFLOPS with "
                  "sparsity, PCIe Gen5 128GB/s)")
_A100 = GpuPreset("a100", "NVIDIA A100 SXM4 80GB", 80, 2.039, 312, 32, "PCIe Gen4 x16",
                  (r"\bA100-SXM4-80GB\b", r"\bA100 80GB\b"), "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB "
                  "SXM: 80GB HBM2e, 2,039GB/s, BF16 312 TFLOPS dense, 624 with sparsity, PCIe Gen4 64GB/s)")
_B200 = GpuPreset("b200", "NVIDIA B200 180GB", 180, 8.0, 2250, 64, "PCIe Gen5 x16", (r"\bB200\b",),
                  "NVIDIA HGX B200 datasheet (8 GPUs: 1.4TB HBM3e, 64TB/s, FP16/BF16 36 PFLOPS with sparsity: per "
                  "GPU 180GB, 8TB/s, 2.25 PFLOPS dense); host link PCIe Gen5 x16 of the DGX B200's Xeon hosts")

def _node(gpu: GpuPreset, name: str, label: str, host_source: str) -> GpuPreset:
    """An 8-GPU DGX node of ``gpu``: its figures, 8 GPUs per node and 2 TiB of host memory."""
    return replace(gpu, name=name, label=label, gpus_per_node=8, host_gib=2048, host_source=host_source)


#: The GPUs (one each; ``gpus_per_node`` 1, no host memory) and nodes (``dgx-*``, ``gh200``: GPUs per node and the
#: node's host memory) ``plan --gpu`` takes.
GPUS: Registry[GpuPreset] = Registry("GPU preset", ((p.name, p) for p in (
    _H100,
    GpuPreset("h100-pcie", "NVIDIA H100 PCIe 80GB", 80, 2.0, 756, 64, "PCIe Gen5 x16", (r"\bH100 PCIe\b",),
              "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe: 80GB HBM2e, 2TB/s, BF16 1,513 TFLOPS with "
              "sparsity, PCIe Gen5 128GB/s)"),
    _H200,
    _A100,
    GpuPreset("l40s", "NVIDIA L40S 48GB", 48, 0.864, 362, 32, "PCIe Gen4 x16", (r"\bL40S\b",),
              "NVIDIA L40S datasheet (48GB GDDR6, 864GB/s, BF16 362.05 TFLOPS dense, 733 with sparsity, PCIe Gen4 "
              "x16 64GB/s bidirectional)"),
    GpuPreset("gh200", "NVIDIA GH200 Grace Hopper Superchip 96GB", 96, 4.0, 989, 450, "NVLink-C2C", (r"\bGH200\b",),
              "NVIDIA GH200 Grace Hopper Superchip datasheet (96GB HBM3, 4TB/s, BF16 1,979 TFLOPS with sparsity, "
              "NVLink-C2C 900GB/s bidirectional)", 1, 480, "GH200 datasheet: up to 480GB LPDDR5X (the largest; "
              "give --host-mem for yours)"),
    _B200,
    _node(_A100, "dgx-a100", "NVIDIA DGX A100 640GB (8 × A100 SXM4 80GB)", "NVIDIA DGX A100 datasheet: 2TB "
          "system memory (the 640GB system)"),
    _node(_H100, "dgx-h100", "NVIDIA DGX H100 (8 × H100 SXM5 80GB)", "NVIDIA DGX H100 datasheet: 2TB system memory"),
    _node(_H200, "dgx-h200", "NVIDIA DGX H200 (8 × H200 SXM 141GB)", "NVIDIA DGX H200 datasheet: 2TB system memory"),
    _node(_B200, "dgx-b200", "NVIDIA DGX B200 (8 × B200 180GB)", "NVIDIA DGX B200 datasheet: 2TB system memory "
          "(up to 4TB)"),
)))


def gpu_preset(name: str) -> GpuPreset:
    """The preset called ``name`` (case-insensitive).

    Raises:
        BadParameter: an unknown name (``gpu``), with the closest names and every preset.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in GPUS:
        raise BadParameter(f"{{gpu}} {name!r}: {GPUS.did_you_mean(str(name), n=2, quote=False)}presets: "
                           f"{', '.join(GPUS.names())}", "gpu")
    return GPUS[key]


def measured_here(preset: GpuPreset, gpu_name: str) -> bool:
    """Whether the GPU NVML named ``gpu_name`` is the kind ``preset`` describes (one of its :attr:`GpuPreset.nvml_names`
    matches): ``H200`` in ``NVIDIA H200`` but not in ``NVIDIA GH200 480GB``."""
    return any(re.search(pattern, gpu_name) for pattern in preset.nvml_names)


__all__ = ["GPUS", "GpuPreset", "gpu_preset", "measured_here"]
