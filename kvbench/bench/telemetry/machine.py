"""The machine a run is measured on: versions, CPU, memory, GPUs with their PCIe link (NVML), the git commit, the
device's measured memory bandwidth, and on CUDA the measured host↔device copy bandwidth (the limit every offload
mode's transfers run against)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

from kvbench.cache_dir import cache_dir

#: Bytes per copy of the bandwidth probe (the issue asks for at least 256 MiB).
PROBE_BYTES = 256 * 2**20
#: File name of the last link probe in :func:`cache_dir`.
LAST_PROBE = "last_link_probe.json"


def save_link_probe(env: dict[str, Any]) -> Path | None:
    """Keep the link bandwidth an environment measured (``kvbench env`` on CUDA) for ``kvbench plan``'s default;
    returns the file, or None when nothing was measured or the cache directory cannot be written (a warning)."""
    if not env.get("link_bandwidth"):
        return None
    gpus = env.get("gpus") or []
    record = {"measured_at": env.get("measured_at"), "gpu": gpus[0]["name"] if gpus else None,
              "link_bandwidth": env["link_bandwidth"]}
    path = cache_dir() / LAST_PROBE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"cannot keep the link probe in {path}: {exc.strerror or exc}", stacklevel=2)
        return None
    return path


def last_link_probe() -> tuple[float, str] | None:
    """``(host→device GB/s pinned, where it came from)`` of the last :func:`save_link_probe`, or None when there
    is none (or it is unreadable)."""
    path = cache_dir() / LAST_PROBE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        gbps = record["link_bandwidth"]["h2d_pinned_gbps"]
        if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or not (gbps > 0 and math.isfinite(gbps)):
            raise ValueError(f"h2d_pinned_gbps is {gbps!r}, not a number of GB/s above 0")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{path}: ignored ({exc.strerror if isinstance(exc, OSError) else exc}); run kvbench env on "
                      "a GPU to measure the link again", stacklevel=2)
        return None
    when = f" {record['measured_at']}" if record.get("measured_at") else ""
    return float(gbps), f"measured by kvbench env{when} on {record.get('gpu') or 'a GPU'}"


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git() -> dict[str, Any]:
    src = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return {"commit": None, "dirty": None, "note": "not a git checkout"}
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=src,
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "dirty": None, "note": f"git unavailable: {exc}"}


def _cpu_name() -> str:
    with contextlib.suppress(OSError):  # no /proc (not Linux, or a locked-down container)
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpus() -> dict[str, Any]:
    """GPUs as NVML sees them: index, name, memory, PCIe generation and width (current and max), and the driver.

    Returns ``{"gpus": None, "driver": None, "note": reason}`` when NVML cannot be used (no library, no driver,
    no device): never zeros.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no library, no driver, no device: all mean "no GPU figures"
        return {"gpus": None, "driver": None, "note": f"NVML unavailable: {exc}"}
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)),
                                 "memory_total_bytes": pynvml.nvmlDeviceGetMemoryInfo(h).total}
            for key, fn in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                            ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                            ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                            ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
                try:
                    g[key] = getattr(pynvml, fn)(h)
                except Exception:
                    g[key] = None
            out.append(g)
        return {"gpus": out, "driver": _text(pynvml.nvmlSystemGetDriverVersion())}
    finally:
        pynvml.nvmlShutdown()


def probe_link_bandwidth(device: Any, nbytes: int = PROBE_BYTES, repeats: int = 5) -> dict[str, float]:
    """Host↔device copy bandwidth in GB/s (10^9 bytes/s): H2D and D2H, from pinned and from pageable host memory.

    Each figure is the median of ``repeats`` timed copies of ``nbytes`` (after one untimed copy), timed with CUDA
    events on the copying stream.

    Raises:
        RuntimeError: ``device`` is not a CUDA device.
    """
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        raise RuntimeError(f"the link bandwidth probe needs a CUDA device, not {device}")
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out: dict[str, float] = {}
    for kind in ("pinned", "pageable"):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        for direction, (dst, src) in (("h2d", (dev, host)), ("d2h", (host, dev))):
            times = []
            for i in range(repeats + 1):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                dst.copy_(src, non_blocking=(kind == "pinned"))
                end.record()
                end.synchronize()
                if i:
                    times.append(start.elapsed_time(end) / 1e3)
            out[f"{direction}_{kind}_gbps"] = nbytes / statistics.median(times) / 1e9
        del host
    return out


def probe_memory_bandwidth(device: Any, nbytes: int = PROBE_BYTES, repeats: int = 5) -> dict[str, Any]:
    """The compute device's own memory bandwidth, from a copy of ``nbytes`` within it (GPU memory on CUDA, RAM on
    CPU): ``copy_gbps`` = bytes copied per second, ``memory_gbps`` = bytes read + written per second (2 × copy, as
    STREAM counts a copy), both in GB/s (10^9 bytes/s); median of ``repeats`` copies after one untimed. This is the
    device-memory bandwidth of plan's decode-step roofline; on CPU, copies between host buffers (full offload's
    "link") also run at ``copy_gbps``.

    Raises:
        RuntimeError: the probe buffers cannot be allocated.
    """
    import time

    import torch

    device = torch.device(device)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 1):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            elapsed = time.perf_counter() - t0
        if i:
            times.append(elapsed)
    copy = nbytes / statistics.median(times) / 1e9
    return {"device": str(device), "copy_gbps": copy, "memory_gbps": 2 * copy}


def environment(device: Any = None) -> dict[str, Any]:
    """Versions (kvbench, torch, transformers, Python), CPU, memory, GPUs (PCIe link) and driver, git commit and
    dirty flag; with a ``device``, its memory bandwidth (``memory_bandwidth``, see :func:`probe_memory_bandwidth`);
    with a CUDA ``device``, its measured link bandwidth (``link_bandwidth``, GB/s), else null with the reason in
    ``link_bandwidth_note``."""
    import psutil
    import torch
    import transformers

    from kvbench.version import __version__

    env = {
        "kvbench": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": psutil.cpu_count(logical=True),
        "load_average_1m": os.getloadavg()[0],
        "memory_total_bytes": psutil.virtual_memory().total,
        "cuda": torch.version.cuda,
        **gpus(),
        "git": _git(),
        "measured_at": _now(),
        "link_bandwidth": None,
    }
    if device is not None:
        try:
            env["memory_bandwidth"] = probe_memory_bandwidth(device)
        except RuntimeError as exc:  # e.g. out of memory for the probe buffers
            env["memory_bandwidth"] = None
            env["memory_bandwidth_note"] = f"probe failed: {exc}"
    if device is not None and torch.device(device).type == "cuda":
        env["cuda_device_name"] = torch.cuda.get_device_name(device)
        try:
            env["link_bandwidth"] = probe_link_bandwidth(device)
        except RuntimeError as exc:  # e.g. out of memory for the probe buffers
            env["link_bandwidth_note"] = f"probe failed: {exc}"
    else:
        env["link_bandwidth_note"] = "no CUDA device: host↔device bandwidth not measured"
    return env


def where_fields(env: dict[str, Any] | None, worker: str | None = None) -> dict[str, Any]:
    """The :data:`~kvbench.results.rows.PLACEMENT_COLUMNS` of the trials run in this process, from its
    :func:`environment` ``env``: host name, GPU name (the first NVML device: with one visible GPU, the trial's) and
    driver, the measured pinned link bandwidth in GB/s (None without a CUDA probe); ``machine`` None and
    ``attempt`` 0 (the driver of a cluster run sets them)."""
    import socket

    env = env or {}
    gpus_seen = env.get("gpus") or []
    link = env.get("link_bandwidth") or {}
    return {"machine": None, "host": socket.gethostname(), "worker": worker, "attempt": 0,
            "gpu": env.get("cuda_device_name") or (gpus_seen[0].get("name") if gpus_seen else None),
            "gpu_driver": env.get("driver"), "link_h2d_gbps": link.get("h2d_pinned_gbps"),
            "link_d2h_gbps": link.get("d2h_pinned_gbps")}


def probe_machine(device: str = "auto") -> dict[str, Any]:
    """This machine as a run on ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) would record it
    (:func:`environment`).

    Raises:
        BadValue: ``device`` is a CUDA device this machine does not have.
    """
    from kvbench.errors import BadValue
    from kvbench.models import resolve_device

    try:
        dev = resolve_device(device)
    except ValueError as exc:
        raise BadValue(str(exc)) from exc
    return environment(dev)
