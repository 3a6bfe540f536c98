"""gunicorn settings for the HTTP API (read from the working directory by every `gunicorn` run here:
the Procfile's `web`, the benchmarks and the tests).

Threaded workers with keep-alive, not sync workers. Agents and scripts keep their
connections open, and a sync worker closes every connection after one request: the new
TCP connection per request, and only one request in flight per process while it waits
on PostgreSQL or Redis, capped the telemetry ingest near 85 requests/s on two cores at
half their CPU. With `gthread` and keep-alive the same two cores took 100 requests/s
(10,000 samples/s) with p50 under 50 ms. Each thread holds its own database connection:
WEB_WORKERS x WEB_THREADS connections in all.
"""
import multiprocessing
import os

worker_class = "gthread"
workers = int(os.environ.get("WEB_WORKERS", multiprocessing.cpu_count() + 1))
threads = int(os.environ.get("WEB_THREADS", 4))
keepalive = int(os.environ.get("WEB_KEEPALIVE_SECONDS", 5))
