"""Small measuring helpers shared by both systems: disk usage, process CPU time, waiting
for background work to end."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def disk_usage_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (like ``du -s``: st_blocks, hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            info = os.lstat(os.path.join(directory, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    total += os.lstat(root).st_blocks * 512
    return total


def apparent_size_bytes(root: Path) -> int:
    """Sum of the regular files' sizes under ``root``."""
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            info = os.lstat(os.path.join(directory, name))
            total += info.st_size
    return total


def median(samples: Iterable[float]) -> float | None:
    values = list(samples)
    return statistics.median(values) if values else None


def percentile(samples: Iterable[float], fraction: float) -> float:
    """The sample below which ``fraction`` of the samples lie (nearest rank); needs one sample."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def peak_rss_bytes(pid: int) -> int | None:
    """The most resident memory ``pid`` has had so far (VmHWM); None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's pid, by its parent's pid."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def process_cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of one process (all threads); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def process_tree_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of ``pid`` and its live descendants (all threads)."""
    children = children_by_parent()
    total = 0.0
    pending = [pid]
    while pending:
        current = pending.pop()
        total += process_cpu_seconds(current) or 0.0
        pending.extend(children.get(current, []))
    return total


@dataclass(frozen=True)
class BackgroundWork:
    """What ran after a call had already answered: for how long, and how much CPU it took."""

    seconds: float
    cpu_seconds: float

    def to_json(self) -> dict[str, float]:
        return {"seconds": round(self.seconds, 3), "cpu_seconds": round(self.cpu_seconds, 3)}


def wait_for_idle_cpu(pid: int, quiet_seconds: float = 1.0, busy_fraction: float = 0.2,
                      limit_seconds: float = 300.0, sample_seconds: float = 0.1) -> BackgroundWork:
    """Waits until the process tree of ``pid`` has used under ``busy_fraction`` of a core for
    ``quiet_seconds`` in a row; returns how long it stayed busy after the call and the CPU
    it spent meanwhile. A busy sample counts up to its end; an idle start gives zero."""
    start = time.perf_counter()
    start_cpu = previous_cpu = process_tree_cpu_seconds(pid)
    previous_time = start
    last_busy_end = start
    busy_cpu_end = start_cpu
    while True:
        time.sleep(sample_seconds)
        now = time.perf_counter()
        cpu = process_tree_cpu_seconds(pid)
        if cpu - previous_cpu > busy_fraction * (now - previous_time):
            last_busy_end = now
            busy_cpu_end = cpu
        previous_cpu, previous_time = cpu, now
        if now - last_busy_end >= quiet_seconds or now - start >= limit_seconds:
            return BackgroundWork(last_busy_end - start, busy_cpu_end - start_cpu)


def cpu_times() -> tuple[int, int]:
    """(steal, all) clock ticks of the whole machine so far: the time the hypervisor gave the
    CPUs to other guests, and all time."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user and nice)
    return fields[7], sum(fields[:8])


def steal_fraction(since: tuple[int, int]) -> float:
    """The share of the CPUs' time since ``since`` (a ``cpu_times``) that the hypervisor took."""
    steal, total = cpu_times()
    return (steal - since[0]) / max(1, total - since[1])
