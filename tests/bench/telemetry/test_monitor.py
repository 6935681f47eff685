"""Samplers: psutil timelines on CPU, NVML readings through the same code path, alerts."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from kvbench.bench.telemetry.monitor import (
    SAMPLER_NICE,
    MonitorWarning,
    Sampler,
    summarise,
)
from kvbench.results.samples import SAMPLE_COLUMNS
from kvbench.bench.telemetry.nvml import gpu_fields

MiB = 2**20


class RecordedNvml:
    """Replays recorded NVML readings (the shape NvmlReader.raw returns), one per call, the last one repeated."""

    def __init__(self, readings):
        self.readings = list(readings)
        self.failed = {}

    def raw(self):
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def wait_for(condition, timeout=5.0):
    """Poll ``condition`` every 5 ms until it holds; fail after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def reading(used, procs, util=40, tx=2_000_000, rx=500_000, power=300_000):
    return {"memory": (used, 80 * 2**30), "processes": procs, "util": util, "pcie_kbps": (tx, rx),
            "power_mw": power}


def test_rss_rises_during_a_trial_that_allocates_a_known_amount():
    sampler = Sampler(torch.device("cpu"), interval_ms=5)
    with sampler.trial("t1") as timeline:
        before = timeline.samples[0]["rss_bytes"]
        block = np.ones(256 * MiB // 8)  # 256 MiB, every page touched
        time.sleep(0.1)
        sampler.mark("decode")
        del block
    s = timeline.samples
    assert len(s) >= 5 and all(r["trial_id"] == "t1" for r in s)
    assert s[0]["phase"] == "prefill" and s[-1]["phase"] == "decode"
    assert max(r["rss_bytes"] for r in s) - before >= 250 * MiB
    assert all(r[k] is None for r in s for k in ("gpu_used_bytes", "gpu_process_bytes", "pinned_host_bytes"))
    assert sampler.notes["gpu"] == "no GPU fields on a cpu device"
    assert [c for c in SAMPLE_COLUMNS if c not in s[0]] == []
    summary = summarise(s)
    assert summary["rss_peak_bytes"] - before >= 250 * MiB
    assert summary["nvml_process_peak_bytes"] is None and summary["n_samples"] == len(s)


def test_nvml_readings_are_filtered_by_pid_and_marked_by_phase():
    me = 4242
    raw = [reading(10 * 2**30, [(1, 3 * 2**30), (me, 5 * 2**30)]),
           reading(12 * 2**30, [(me, 7 * 2**30), (9, 2**30), (me, 2**30)]),  # MIG/MPS: two entries for one pid
           reading(12 * 2**30, [(1, 2**30)])]  # this pid not listed (e.g. another PID namespace)
    assert gpu_fields(raw[0], me)["gpu_process_bytes"] == 5 * 2**30
    assert gpu_fields(raw[1], me)["gpu_process_bytes"] == 8 * 2**30
    assert gpu_fields(raw[2], me)["gpu_process_bytes"] is None  # unknown, not 0
    f = gpu_fields(raw[0], me)
    assert (f["pcie_tx_bytes_per_s"], f["pcie_rx_bytes_per_s"], f["power_w"]) == (2e9, 5e8, 300.0)
    assert gpu_fields({"memory": None, "processes": None, "util": None, "pcie_kbps": None, "power_mw": None},
                      me) == dict.fromkeys(f)

    # a minute's interval: the thread samples only when the mark asks it to
    sampler = Sampler(torch.device("cpu"), interval_ms=60_000, nvml_reader=RecordedNvml(raw))
    sampler.pid = me
    with sampler.trial("p8-b1-full-r0") as timeline:  # reading 1 at start (prefill)
        sampler.mark("decode")                       # reading 2, by the sampler thread
        wait_for(lambda: len(timeline.samples) == 2)
    rows = timeline.samples                          # reading 3 at the end
    assert [(r["phase"], r["gpu_process_bytes"]) for r in rows] == [
        ("prefill", 5 * 2**30), ("decode", 8 * 2**30), ("decode", None)]
    assert summarise(rows)["nvml_process_peak_bytes"] == 8 * 2**30
    assert summarise(rows)["nvml_device_peak_bytes"] == 12 * 2**30


def test_sampler_cpu_time_counts_the_threads_reads():
    niceness = []

    class CostlySampler(Sampler):
        """Each read from the sampler thread burns 2 ms of that thread's CPU."""

        def read(self, timeline, t0, final=False):
            if threading.current_thread().name == "kvbench-sampler":
                niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
                end = time.thread_time() + 0.002
                while time.thread_time() < end:
                    pass
            return super().read(timeline, t0, final)

    sampler = CostlySampler(torch.device("cpu"), interval_ms=5)
    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    start = time.perf_counter()
    with sampler.trial("t") as timeline:
        time.sleep(0.1)
    wall = time.perf_counter() - start
    from_thread = len(timeline.samples) - 2  # less the readings at start and stop, made by this thread
    assert from_thread >= 3
    assert 0.002 * from_thread <= timeline.sampler_cpu_s < wall
    if sys.platform == "linux":  # the sampler thread runs at SAMPLER_NICE (or lower priority); this thread does not
        assert min(niceness) >= SAMPLER_NICE == 10
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice


def test_alert_fires_once_when_device_memory_crosses_the_threshold():
    raw = [reading(10 * 2**30, [(7, 4 * 2**30)]), reading(10 * 2**30, [(7, 9 * 2**30)]),
           reading(10 * 2**30, [(7, 9 * 2**30)]), reading(10 * 2**30, [(7, 2 * 2**30)])]
    seen = []
    sampler = Sampler(torch.device("cpu"), interval_ms=0, alert_device_bytes=8 * 2**30, on_alert=seen.append,
                      nvml_reader=RecordedNvml(raw))
    sampler.pid = 7
    with sampler.trial("t") as timeline:
        sampler.mark("decode")
        sampler.mark("decode")
    assert len(timeline.alerts) == 1 and seen == timeline.alerts
    assert timeline.alerts[0]["device_bytes"] == 9 * 2**30 and timeline.alerts[0]["phase"] == "decode"
    assert timeline.alerts[0]["threshold_bytes"] == 8 * 2**30


def test_sampler_thread_stops_on_errors():
    sampler = Sampler(torch.device("cpu"), interval_ms=1)
    with pytest.raises(KeyboardInterrupt), sampler.trial("t"):
        time.sleep(0.02)
        raise KeyboardInterrupt
    time.sleep(0.01)
    assert not [t for t in threading.enumerate() if t.name == "kvbench-sampler"]


def test_a_paused_sampler_takes_no_samples_and_still_stops():
    sampler = Sampler(torch.device("cpu"), interval_ms=5)
    with sampler.trial("t") as timeline:
        time.sleep(0.06)
        sampler.pause()
        time.sleep(0.05)  # the sleep under way ends, with no reading
        paused_at = len(timeline.samples)
        time.sleep(0.1)
        assert len(timeline.samples) == paused_at  # 20 intervals: none sampled
        sampler.resume()
        time.sleep(0.1)
        assert len(timeline.samples) >= paused_at + 3
        sampler.pause()  # the trial ends while paused: the thread must still end
    assert not [t for t in threading.enumerate() if t.name == "kvbench-sampler"]
    with sampler.trial("next") as timeline:  # a new trial samples again
        time.sleep(0.06)
    assert len(timeline.samples) >= 5


def test_a_long_interval_does_not_hold_the_trial_end():
    sampler = Sampler(torch.device("cpu"), interval_ms=60_000)  # the thread sleeps in steps of STOP_CHECK_S
    start = time.perf_counter()
    with sampler.trial("t") as timeline:
        pass
    assert time.perf_counter() - start < 2  # not the 60 s interval
    assert len(timeline.samples) == 2 and timeline.sampler_cpu_s is not None


def test_cuda_device_without_nvml_gives_nulls_and_one_warning(monkeypatch):
    import kvbench.bench.telemetry.monitor as monitor

    def refuse(device):
        raise monitor.NvmlUnavailable("NVML unavailable: NVML Shared Library Not Found")

    real_host = monitor.HostReader
    monkeypatch.setattr(monitor, "NvmlReader", refuse)
    monkeypatch.setattr(monitor, "HostReader", lambda cuda: real_host(False))  # CPU torch has no pinned stats
    with pytest.warns(MonitorWarning, match="gpu samples are null: NVML unavailable: NVML Shared Library Not Found"):
        sampler = Sampler(torch.device("cuda"), interval_ms=0)
    with sampler.trial("t") as timeline:
        pass
    assert len(timeline.samples) == 2 and all(r["gpu_used_bytes"] is None for r in timeline.samples)
    assert sampler.notes["gpu"] == "NVML unavailable: NVML Shared Library Not Found"


def test_host_reader_matches_psutil_without_opening_files():
    import psutil

    from kvbench.bench.telemetry.host_memory import HostReader

    reader = HostReader(cuda=False)
    first = reader.read()
    rss = psutil.Process().memory_info().rss
    assert abs(first["rss_bytes"] - rss) <= 4 * 2**20  # the same figure, read moments apart
    assert first["pinned_host_bytes"] is None and first["host_available_bytes"] > 0
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # one thread busy for 0.3 s: about 100% of one CPU
        pass
    busy = reader.read()["cpu_percent"]
    assert 60 <= busy <= 140, busy
    assert reader.read()["cpu_percent"] == busy  # under cpu_every_s (0.1 s) later: the last figure repeated
    time.sleep(0.3)
    assert reader.read()["cpu_percent"] <= 40  # asleep


def test_cpu_percent_of_a_trial_is_not_the_time_before_it():
    sampler = Sampler(torch.device("cpu"), interval_ms=0)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # busy before the trial
        pass
    with sampler.trial("idle") as timeline:
        time.sleep(0.08)  # shorter than cpu_every_s
    first, last = timeline.samples[0]["cpu_percent"], timeline.samples[-1]["cpu_percent"]
    assert first is None  # no window yet, not the busy 100% before the trial
    assert last is not None and last <= 40  # the trial's own window, read at its end


def test_samples_of_both_threads_stay_in_time_order():
    sampler = Sampler(torch.device("cpu"), interval_ms=1)
    with sampler.trial("t") as timeline:  # the trial's thread reads at the start and the end, the sampler's between
        end = time.monotonic() + 0.3
        while time.monotonic() < end:  # marks ask for samples while the thread takes its own
            sampler.mark("decode")
    times = [x["t_s"] for x in timeline.samples]
    assert len(times) > 10 and times == sorted(times)


class ThreadRecordingNvml(RecordedNvml):
    """Records the thread of every reading (and the phase the trial had then)."""

    def __init__(self, readings):
        super().__init__(readings)
        self.threads = []

    def raw(self):
        self.threads.append(threading.get_ident())
        return super().raw()


def test_a_mark_reads_nothing_on_the_trials_thread():
    nvml = ThreadRecordingNvml([reading(10 * 2**30, [])])
    kv_threads = []

    def kv_probe():
        kv_threads.append(threading.get_ident())
        return 0, 0, 0

    sampler = Sampler(torch.device("cpu"), interval_ms=5, nvml_reader=nvml)
    me = threading.get_ident()
    with sampler.trial("t", kv_probe=kv_probe) as timeline:
        time.sleep(0.05)
        for _ in range(100):  # marks between "clock readings": the thread samples, this one never reads
            sampler.mark("decode")
            time.sleep(0.001)
        time.sleep(0.05)
    for threads in (nvml.threads, kv_threads):
        assert threads[0] == me and threads[-1] == me  # the start and the end
        assert len(threads) > 4 and me not in threads[1:-1]
    phases = [r["phase"] for r in timeline.samples]
    assert phases[0] == "prefill" and phases[-1] == "decode" and "prefill" in phases[1:-1]
    assert phases == sorted(phases, key=["prefill", "decode"].index)  # one boundary, in time order

    # no thread: a mark only labels, and the end's sample carries its phase
    nvml = ThreadRecordingNvml([reading(10 * 2**30, [])])
    sampler = Sampler(torch.device("cpu"), interval_ms=0, nvml_reader=nvml)
    with sampler.trial("t") as timeline:
        sampler.mark("decode")
        sampler.mark("decode")
    assert nvml.threads == [me, me] and [r["phase"] for r in timeline.samples] == ["prefill", "decode"]
    assert timeline.sampler_cpu_s is None


def test_a_mark_gets_a_sample_soon_even_with_a_long_interval():
    sampler = Sampler(torch.device("cpu"), interval_ms=60_000)
    with sampler.trial("t") as timeline:
        time.sleep(0.02)
        asked = time.perf_counter()
        sampler.mark("decode")
        wait_for(lambda: len(timeline.samples) == 2)
        got = time.perf_counter()
    assert got - asked < 1.0  # STOP_CHECK_S (0.1 s) on an idle machine; slack for a busy one
    assert [r["phase"] for r in timeline.samples] == ["prefill", "decode", "decode"]


class FakeHostAllocator:
    """torch's caching host allocator as host_memory_stats describes it: blocks rounded up to powers of two;
    ``active`` = handed out, ``allocated`` = owned (active + cached); peaks reset to the current level."""

    def __init__(self):
        self.active = self.owned = self.peak = 0
        self.cached: list[int] = []

    def alloc(self, n):
        size = 1 << (n - 1).bit_length()
        if size in self.cached:
            self.cached.remove(size)
        else:
            self.owned += size
        self.active += size
        self.peak = max(self.peak, self.active)
        return size

    def free(self, size):
        self.active -= size
        self.cached.append(size)

    def stats(self):
        return {"active_bytes.current": self.active, "active_bytes.peak": self.peak,
                "allocated_bytes.current": self.owned, "allocated_bytes.peak": self.owned}

    def reset(self):
        self.peak = self.active


def test_pinned_peaks_are_the_trials_own(monkeypatch):
    import kvbench.bench.telemetry.monitor as monitor

    fake = FakeHostAllocator()
    fake.free(fake.alloc(512 * MiB))  # an earlier trial's block, cached
    fake.alloc(256 * MiB)  # the link probe's buffer, still held
    real_host = monitor.HostReader
    monkeypatch.setattr(monitor, "HostReader",
                        lambda cuda: real_host(True, pinned_stats=fake.stats, reset_pinned_peak=fake.reset))
    sampler = Sampler(torch.device("cpu"), interval_ms=0)
    assert (fake.peak, fake.owned) == (512 * MiB, 768 * MiB)  # peaks from before the trial
    with sampler.trial("t", pinned_probe=lambda: 8 * MiB) as timeline:
        a = fake.alloc(3 * MiB)  # the cache asks for 3 + 5 MiB; torch pins 4 + 8
        fake.alloc(5 * MiB)
        fake.free(a)
    summary = summarise(timeline.samples, timeline.peaks)
    assert summary["pinned_host_allocated_peak_bytes"] == 12 * MiB  # not the 256 MiB held before, nor 512 or 768
    assert summary["pinned_host_requested_peak_bytes"] == 8 * MiB
    assert timeline.samples[0]["pinned_host_bytes"] == 768 * MiB  # the pool the process holds, per sample
    assert "pinned_host_allocated_peak_bytes" not in sampler.notes

    monkeypatch.setattr(monitor, "HostReader", real_host)
    cpu = Sampler(torch.device("cpu"), interval_ms=0)
    with cpu.trial("t", pinned_probe=lambda: 8 * MiB) as timeline:
        pass
    summary = summarise(timeline.samples, timeline.peaks)
    assert summary["pinned_host_allocated_peak_bytes"] is None and summary["pinned_host_requested_peak_bytes"] is None
    for field in ("pinned_host_allocated_peak_bytes", "pinned_host_requested_peak_bytes"):
        assert cpu.notes[field] == "no CUDA device: no pinned host memory"


needs_clear_refs = pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK),
                                      reason="the kernel's peak RSS cannot be reset here")


SPIKE = """
import json, torch
from kvbench.bench.telemetry.monitor import Sampler, summarise
MiB = 2**20
sampler = Sampler(torch.device("cpu"), interval_ms=0)  # samples only at the start and the end
with sampler.trial("spike") as timeline:
    base = timeline.samples[0]["rss_bytes"]
    block = bytearray(200 * MiB)
    for i in range(0, len(block), 4096):  # touch every page
        block[i] = 1
    del block
kernel, sampled = summarise(timeline.samples, timeline.peaks), summarise(timeline.samples)
with sampler.trial("after") as timeline:
    pass
after = summarise(timeline.samples, timeline.peaks)
print(json.dumps({"base": base, "kernel": kernel, "sampled": sampled, "after": after}))
"""


@needs_clear_refs
def test_the_kernel_peak_catches_a_spike_no_sample_sees():
    # In a fresh process: the kernel's peak is the whole process's, and the tests before this one leave threads
    # and allocations behind that are not the trial's (CI once read VmHWM at the first sample's level)
    got = json.loads(subprocess.run([sys.executable, "-c", SPIKE], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    base, kernel, sampled = got["base"], got["kernel"], got["sampled"]
    assert kernel["rss_peak_source"] == "kernel VmHWM"
    assert kernel["rss_peak_bytes"] >= base + 190 * MiB
    assert sampled["rss_peak_bytes"] < base + 100 * MiB  # what the samples alone would say
    assert sampled["rss_peak_source"] == "sampled"
    assert got["after"]["rss_peak_bytes"] < base + 100 * MiB  # reset per trial: not the next trial's peak


def test_a_mapped_file_read_through_is_file_backed_not_anonymous(tmp_path):
    from kvbench.bench.telemetry.host_memory import HostReader, read_status

    path = tmp_path / "history.bin"
    with path.open("wb") as f:
        for _ in range(64):
            f.write(b"\1" * MiB)
    sampler = Sampler(torch.device("cpu"), interval_ms=0)
    with sampler.trial("mmap") as timeline, path.open("rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        assert sum(mm[i] for i in range(0, len(mm), 4096)) == 64 * MiB // 4096  # every page read
    first, last = timeline.samples[0], timeline.samples[-1]
    summary = summarise(timeline.samples, timeline.peaks)
    mm.close()
    assert last["rss_file_bytes"] - first["rss_file_bytes"] >= 60 * MiB
    assert abs(last["rss_anon_bytes"] - first["rss_anon_bytes"]) < 8 * MiB
    assert summary["rss_file_peak_bytes"] >= first["rss_file_bytes"] + 60 * MiB
    assert summary["rss_anon_peak_bytes"] < first["rss_anon_bytes"] + 8 * MiB
    # statm's resident − shared is the kernel's RssAnon; shared is RssFile + RssShmem
    row, status = HostReader(cuda=False).read(), read_status()
    assert abs(row["rss_anon_bytes"] - status["RssAnon"]) <= MiB
    assert abs(row["rss_file_bytes"] - status["RssFile"] - status["RssShmem"]) <= MiB


def test_without_clear_refs_the_peak_is_sampled_and_says_so(monkeypatch, tmp_path):
    import kvbench.bench.telemetry.host_memory as host_memory

    monkeypatch.setattr(host_memory, "CLEAR_REFS", str(tmp_path / "no-clear_refs"))
    for interval, source in ((20, "sampled every 20 ms"), (0, "sampled at the trial's start and end (interval_ms 0)")):
        sampler = Sampler(torch.device("cpu"), interval_ms=interval)
        with sampler.trial("t") as timeline:
            time.sleep(0.1)
        summary = summarise(timeline.samples, timeline.peaks)
        assert summary["rss_peak_source"] == source
        assert summary["rss_peak_bytes"] == max(r["rss_bytes"] for r in timeline.samples)
        assert sampler.notes["rss_peak_bytes"] == (f"cannot reset the kernel's peak RSS: {tmp_path}/no-clear_refs: "
                                                   f"No such file or directory; the peak is {source}")
