"""Page load benchmark: `python -m benchmarks.page_load --json FILE`.

Starts the embedded demo (`manage.py runembedded`, which collects the static files: compressed and
fingerprinted, as a release serves them) on a free port in a temporary folder, signs in as bob in
headless Chromium (Debian's) and loads each page `--visits` times in one browser, so every visit after
the first finds the static files in the browser's cache. Per page it reports the first visit and the
median and worst of the later ones: DOMContentLoaded and load (the Navigation Timing API, from the
navigation's start), and the bytes the first visit transferred.

The pool page draws Plotly charts; the reservations page loads no Plotly and is the baseline run
beside it: the ratio of the two is what Plotly costs a visit on this machine, whose speed drifts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
PAGES = {"pool (Plotly charts)": "/pools/h100/", "reservations (baseline, no Plotly)": "/reservations/"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_demo(var_dir: str, port: int) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if key not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PORTAL_VAR_DIR=var_dir, PORT=str(port))
    process = subprocess.Popen([sys.executable, "manage.py", "runembedded", "--port", str(port)], cwd=BASE_DIR,
                               env=env, stdout=open(Path(var_dir) / "demo.log", "wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    raise SystemExit("the demo did not start:\n" + (Path(var_dir) / "demo.log").read_text()[-3000:])


def _password(var_dir: str) -> str:
    text = (Path(var_dir) / "demo-credentials.txt").read_text()
    match = re.search(r"^bob (\S+)$", text, re.M)
    if not match:
        raise SystemExit(f"no password for bob in {var_dir}/demo-credentials.txt")
    return match.group(1)


def measure(base: str, password: str, visits: int) -> dict:
    from playwright.sync_api import sync_playwright

    results = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        page.goto(f"{base}/login/")
        page.fill("input[name=username]", "bob")
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        for name, path in PAGES.items():
            rows = []
            for _ in range(visits):
                page.goto(f"{base}{path}", wait_until="load")
                rows.append(page.evaluate("""() => {
                    const nav = performance.getEntriesByType("navigation")[0];
                    const bytes = performance.getEntriesByType("resource").reduce((n, r) => n + r.transferSize, 0);
                    return {dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd,
                            bytes: bytes + nav.transferSize};
                }"""))
            later = rows[1:] or rows
            results[name] = {
                "path": path, "visits": visits,
                "first_dcl_ms": rows[0]["dcl"], "first_load_ms": rows[0]["load"], "first_bytes": rows[0]["bytes"],
                "later_dcl_ms_median": statistics.median(r["dcl"] for r in later),
                "later_load_ms_median": statistics.median(r["load"] for r in later),
                "later_load_ms_worst": max(r["load"] for r in later),
                "later_bytes_median": statistics.median(r["bytes"] for r in later),
            }
        browser.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visits", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpupool-page-load-") as var_dir:
        port = _free_port()
        demo = _start_demo(var_dir, port)
        try:
            time.sleep(5)  # a few seconds of telemetry, so the charts have points to draw
            results = measure(f"http://127.0.0.1:{port}", _password(var_dir), args.visits)
        finally:
            os.killpg(demo.pid, signal.SIGTERM)
            demo.wait(timeout=30)
    baseline = results["reservations (baseline, no Plotly)"]["later_load_ms_median"]
    print(f"{'page':38} {'first load':>11} {'first KB':>9} {'later DCL':>10} {'later load':>11} {'worst':>7} "
          f"{'later KB':>9} {'× baseline':>10}")
    for name, row in results.items():
        print(f"{name:38} {row['first_load_ms']:9.0f}ms {row['first_bytes'] / 1024:9.0f} "
              f"{row['later_dcl_ms_median']:8.0f}ms {row['later_load_ms_median']:9.0f}ms "
              f"{row['later_load_ms_worst']:5.0f}ms {row['later_bytes_median'] / 1024:9.0f} "
              f"{row['later_load_ms_median'] / baseline:10.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pages": results, "load_avg": os.getloadavg()}, indent=2))


if __name__ == "__main__":
    main()
