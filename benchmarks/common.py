"""Helpers the benchmarks share: percentiles, per-call summaries, free ports, and what a process tree
used (CPU seconds, peak RSS) read from Linux /proc (psutil is not a dependency)."""
from __future__ import annotations

import os
import socket
import statistics
import time
import urllib.request
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank over n - 1, as benchmarks.api has always reported); 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summarize_calls(latencies: dict[str, list[float]], statuses: dict[str, dict[int, int]],
                    seconds: float) -> dict[str, dict]:
    """Per call name: requests, per_s, p50/p95/p99/mean in ms and the status counts."""
    out = {}
    for name, values in latencies.items():
        out[name] = {
            "requests": len(values),
            "per_s": round(len(values) / seconds, 1),
            "p50_ms": round(percentile(values, 50), 2),
            "p95_ms": round(percentile(values, 95), 2),
            "p99_ms": round(percentile(values, 99), 2),
            "mean_ms": round(statistics.fmean(values), 2) if values else 0.0,
            "statuses": {str(k): v for k, v in sorted(statuses[name].items())},
        }
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, processes=(), seconds: float = 120) -> bool:
    """Poll `url` until it answers 200; False if one of `processes` exits or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        if any(p.poll() is not None for p in processes):
            return False
        time.sleep(0.3)
    return False


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + system CPU seconds) for every process."""
    ticks = os.sysconf("SC_CLK_TCK")
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    return table


def process_tree(roots: list[int], table: dict | None = None) -> set[int]:
    """These processes and all their descendants (now living)."""
    table = table if table is not None else _proc_table()
    wanted = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in table.items():
            if ppid in wanted and pid not in wanted:
                wanted.add(pid)
                changed = True
    return wanted


def cpu_seconds(roots: list[int]) -> float:
    """User + system CPU seconds of these processes and their living children (Linux /proc)."""
    table = _proc_table()
    return sum(table.get(pid, (0, 0.0))[1] for pid in process_tree(roots, table))


def peak_rss_mib(roots: list[int]) -> float:
    """Sum over the process tree of each process's peak resident set (VmHWM), in MiB."""
    total_kib = 0
    for pid in process_tree(roots):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kib += int(line.split()[1])
                    break
        except OSError:
            continue
    return round(total_kib / 1024, 1)
