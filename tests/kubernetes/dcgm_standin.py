"""STAND-IN at the hardware edge: simulated DCGM exporter metrics (the one stand-in of the Kubernetes
telemetry tests and benchmark; no GPU here).

Serves `/metrics` in the text format and label set of NVIDIA's dcgm-exporter (3.x with the
Kubernetes pod mapping on): each series carries `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`Hostname`, `DCGM_FI_DRIVER_VERSION`, and, while a pod uses the GPU, `container`, `namespace`, `pod`;
a MIG instance adds `GPU_I_PROFILE` and `GPU_I_ID`. Values move with time (each GPU follows its own
wave, or a level a test sets), so charts and alerts have something to follow.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DRIVER = "535.104.05"
MODEL = "NVIDIA H100 80GB HBM3"
TOTAL_MIB = 81559
RESERVED_MIB = 577

HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
}


@dataclass
class SimGpu:
    uuid: str
    hostname: str
    index: int
    # (namespace, pod, container) of the pods on it, as the exporter's pod mapping names them
    pods: list[tuple[str, str, str]] = field(default_factory=list)
    util: float | None = None  # a fixed utilization; None: a wave


class DcgmStandIn:
    """A threaded HTTP server of simulated dcgm-exporter text for `gpus` (changeable while it runs)."""

    def __init__(self, gpus: list[SimGpu], host: str = "127.0.0.1", port: int = 0) -> None:
        self.gpus = gpus
        self.lock = threading.Lock()
        self.scrapes = 0
        self._prefix_cache: dict[tuple, list] = {}
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = standin.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> DcgmStandIn:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def set(self, uuid: str, *, util: float | None = None, pods: list[tuple[str, str, str]] | None = None) -> None:
        with self.lock:
            for gpu in self.gpus:
                if gpu.uuid == uuid:
                    gpu.util = util
                    if pods is not None:
                        gpu.pods = list(pods)

    def _prefixes(self, gpu: SimGpu) -> list[tuple[str, list[str]]]:
        """Each series' text up to its value, per field in HELP's order (made once per GPU and pods: the
        benchmark's 10,000 GPUs are scraped every few seconds on the machine being measured)."""
        key = (gpu.uuid, gpu.hostname, gpu.index, tuple(gpu.pods))
        found = self._prefix_cache.get(key)
        if found is None:
            base = (f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="00000000:{0x18 + gpu.index:02X}:00.0",'
                    f'device="nvidia{gpu.index}",modelName="{MODEL}",Hostname="{gpu.hostname}",'
                    f'DCGM_FI_DRIVER_VERSION="{DRIVER}"')
            label_sets = ([f'{base},container="{c}",namespace="{ns}",pod="{p}"' for ns, p, c in gpu.pods]
                          or [base])
            found = self._prefix_cache[key] = [(name, [f"{name}{{{labels}}} " for labels in label_sets])
                                               for name in HELP]
        return found

    def render(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        with self.lock:
            self.scrapes += 1
            gpus = [SimGpu(g.uuid, g.hostname, g.index, list(g.pods), g.util) for g in self.gpus]
        values: dict[str, list[str]] = {name: [] for name in HELP}
        for gpu in gpus:
            phase = (hash(gpu.uuid) % 1000) / 1000 * 2 * math.pi
            util = gpu.util if gpu.util is not None else round(50 + 45 * math.sin(now / 20 + phase))
            used = int(TOTAL_MIB * util / 100 * 0.9) if util else 0
            values_of = (util, int(util // 2), TOTAL_MIB - RESERVED_MIB - used, used, RESERVED_MIB, 35 + int(util * 0.4),
                         round(70 + 6.3 * util, 3), 0, round(util / 100, 6))
            for (name, prefixes), value in zip(self._prefixes(gpu), values_of):
                values[name].extend(prefix + str(value) for prefix in prefixes)
        lines = []
        for name, series in values.items():
            kind, text = HELP[name]
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *series]
        return "\n".join(lines) + "\n"
