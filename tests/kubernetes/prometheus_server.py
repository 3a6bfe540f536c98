"""A real Prometheus server (Debian's `prometheus` package, installed by scripts/test-services) for the
Kubernetes telemetry tests and benchmark: started on a free loopback port with a temporary config and
data directory, scraping the given targets, and stopped again."""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    def __init__(self, targets: list[str], *, scrape_interval: str = "1s", port: int | None = None,
                 directory: Path | None = None) -> None:
        self.targets = targets
        self.scrape_interval = scrape_interval
        self.port = port or free_port()
        self.dir = Path(directory or tempfile.mkdtemp(prefix="gpupool-prometheus-"))
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> PrometheusServer:
        config = {"global": {"scrape_interval": self.scrape_interval, "evaluation_interval": "1m"},
                  "scrape_configs": [{"job_name": "dcgm-exporter", "honor_labels": True,
                                      "scrape_timeout": self.scrape_interval if self.scrape_interval.endswith("s")
                                      and int(self.scrape_interval[:-1]) < 10 else "10s",
                                      "static_configs": [{"targets": self.targets}]}]}
        (self.dir / "data").mkdir(parents=True, exist_ok=True)
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(self.dir / "prometheus.log", "ab")
        self.process = subprocess.Popen(
            [BINARY, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--web.enable-lifecycle"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.process.returncode}): "
                                   + (self.dir / "prometheus.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus did not get ready within {timeout} s")

    def wait_for_series(self, query: str, count: int, timeout: float = 30) -> None:
        """Until `query` answers at least `count` series (the first scrapes are in)."""
        import json
        from urllib.parse import urlencode

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v1/query?{urlencode({'query': query})}",
                                            timeout=5) as response:
                    if len(json.load(response)["data"]["result"]) >= count:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"prometheus has fewer than {count} series of {query} after {timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if getattr(self, "log", None):
            self.log.close()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
