"""The columns of a run's ``samples.csv``: one row per sample of every recorded trial, written by
:meth:`kvbench.results.run_dir.RunDir.append_samples` from what the samplers (:mod:`kvbench.bench.telemetry.monitor`)
read. Units are in the names (``_bytes`` bytes, ``_percent`` percent, ``_per_s`` per second, ``_w`` watts); an empty
cell is a field that could not be read (never 0)."""

from __future__ import annotations

#: The process's and the host's memory and CPU (:class:`kvbench.bench.telemetry.host_memory.HostReader`): resident
#: memory, its anonymous and file-backed parts, CPU % (100 = one core), the host's available memory and the
#: page-locked memory torch's host allocator holds.
HOST_FIELDS = ("rss_bytes", "rss_anon_bytes", "rss_file_bytes", "cpu_percent", "host_available_bytes",
               "pinned_host_bytes")
#: The device through NVML: memory used (device, total, this process), utilisation, PCIe TX/RX and power.
GPU_FIELDS = ("gpu_used_bytes", "gpu_total_bytes", "gpu_process_bytes", "gpu_util_percent",
              "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "power_w")
#: The cache's own accounting of KV bytes per tier (see :meth:`kvbench.bench.telemetry.monitor.Sampler.trial`'s
#: ``kv_probe``).
KV_FIELDS = ("kv_device_bytes", "kv_host_bytes", "kv_disk_bytes")
#: Columns of ``samples.csv``: the trial, its phase (``prefill``/``decode``), ``t_s`` (seconds since the trial's
#: sampler started), then the fields above.
SAMPLE_COLUMNS = ("trial_id", "phase", "t_s", *HOST_FIELDS, *GPU_FIELDS, *KV_FIELDS)

__all__ = ["GPU_FIELDS", "HOST_FIELDS", "KV_FIELDS", "SAMPLE_COLUMNS"]
