# GPU Pool Portal. `make run`: the embedded demo. `make test`: the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000

# Tests run against real PostgreSQL and Redis; these defaults match scripts/test-services.
TEST_DATABASE_URL ?= postgres://gpupool:gpupool@127.0.0.1:5432/gpupool
TEST_REDIS_URL ?= redis://127.0.0.1:6379/14
# The suite runs in this many pytest-xdist processes, a test file each at a time (tests/parallel.py gives each
# its own Redis database; pytest-django its own test database). Most of a test's time is waiting on a server,
# a browser or a child process, so two share the two cores well. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

.PHONY: run test venv dev-venv services benchmark-api benchmark-api-cpu benchmark-api-floor benchmark-history benchmark-sharing benchmark-queue benchmark-telemetry-history benchmark-k8s-telemetry benchmark-apply benchmark-page-load benchmark-page-cost benchmark-fleet benchmark-usage benchmark-idle-reclaim clean

$(VENV)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt requirements-ldap.txt requirements.txt cli/pyproject.toml $(VENV)/.runtime
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(VENV)/.runtime
dev-venv: $(VENV)/.dev

run: $(VENV)/.runtime
	env -u REDIS_URL PORT=$(PORT) $(PY) manage.py runembedded

services:
	scripts/test-services

# Where the benchmark targets write their JSON (ignored by git, so a fresh clone lacks it).
benchmarks/results:
	mkdir -p $@

TEST_ENV = DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) SECRET_KEY=test-only-secret
# The workers, then the files of tests/parallel.py's SERIAL_TESTS in one process of their own (in an xdist worker
# schemathesis 4.32 runs the first of test_api_schema's operations and none of the other 77, counted). The plugin
# leaves those files out of the workers and every other file out of the serial run, so PYTEST_ARGS (paths, -k)
# go to both runs and no file runs twice; a run they leave without a test (pytest's exit status 5) is no failure.

# services first: they install the headers python-ldap (requirements-ldap.txt) compiles against.
test: services $(VENV)/.dev
ifeq ($(TEST_WORKERS),0)
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS)
else
	$(TEST_ENV) $(PY) -m pytest -p tests.parallel -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(TEST_ENV) $(PY) -m pytest -p tests.parallel --serial-only $(PYTEST_ARGS) || [ $$? -eq 5 ]
endif

BENCH_DATABASE_URL ?= postgres://gpupool:gpupool@127.0.0.1:5432/gpupool_bench

benchmark-api: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.api --serve --concurrency 32 --seconds 30 --json benchmarks/results/api.json

# CPU per reservation API call in one process, beside a /healthz baseline (low-noise A/B of the request path).
benchmark-api-cpu: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.api_cpu --calls 200 --json benchmarks/results/api-cpu.json

# The ceiling under the API: create + release through the services with no HTTP, then their bare SQL
# through psycopg; PostgreSQL's and the clients' CPU per cycle (run it on the database's machine).
benchmark-api-floor: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.api_floor --processes 2 --connections 16 --seconds 20 --json benchmarks/results/api-floor.json

# Fractional and MIG requests from the gpushare40 trace through the reservation service vs the engine alone.
benchmark-sharing: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.sharing --rounds 5 --json benchmarks/results/sharing.json

# The Alibaba trace's whole-GPU tasks as teams would send them, through the real services with a simulated
# clock, per queue ordering with and without backfill; then one pass over long queues on the 1,213-node cluster.
benchmark-queue: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.queue --json benchmarks/results/queue.json

benchmark-history: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.history --past 200000 --calls 50 --json benchmarks/results/history.json

# Reservation → active / release → clean on a real Kubernetes control plane and through a simulated-host
# agent, plus the agent's memory and CPU. --fresh-db drops and recreates this database (and empties this Redis db).
APPLY_BENCH_DATABASE_URL ?= postgres://gpupool:gpupool@127.0.0.1:5432/gpupool_applybench
APPLY_BENCH_REDIS_URL ?= redis://127.0.0.1:6379/10

benchmark-apply: services $(VENV)/.dev | benchmarks/results
	DATABASE_URL=$(APPLY_BENCH_DATABASE_URL) REDIS_URL=$(APPLY_BENCH_REDIS_URL) SECRET_KEY=bench-only \
		$(PY) -m benchmarks.apply --fresh-db --json benchmarks/results/apply.json

# Kubernetes GPUs read through a real Prometheus (10,000 GPUs on 1,250 nodes, every 5 s) beside the agent
# ingest's CPU for as many samples, and sample → WebSocket client latency.
benchmark-k8s-telemetry: $(VENV)/.dev services | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.k8s_telemetry --gpus 10000 --json benchmarks/results/k8s-telemetry.json

# Telemetry at the issue's targets: 10,000 GPUs at 1 Hz and 1,000 WebSocket dashboards, Redis
# mode (PostgreSQL + Redis, 2 uvicorn workers, the web server as config/web.py runs it), then the embedded
# mode (SQLite, in-process). 15 s of warm-up: 100 agents and 1,000 sockets start within seconds of
# each other and the first requests fill the caches.
benchmark-telemetry-history: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.telemetry_history --fleets 1000,10000 --calls 20 \
		--json benchmarks/results/telemetry-history.json

# A year of a 1,000-team, 10,000-GPU fleet's usage ledger, and the usage report over it (its own database).
benchmark-usage: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_usage_bench 2>/dev/null || true
	DATABASE_URL=postgres://gpupool:gpupool@127.0.0.1:5432/gpupool_usage_bench REDIS_URL=redis://127.0.0.1:6379/13 \
		SECRET_KEY=bench-only $(PY) -m benchmarks.usage --teams 1000 --gpus 10000 --json benchmarks/results/usage.json

# GE-hours per day idle reclaim would give back at a few (warn, release) settings, on demo-like bookings and the
# Alibaba trace (no database: the policy's decisions replayed a minute at a time).
benchmark-idle-reclaim: $(VENV)/.dev | benchmarks/results
	$(PY) -m benchmarks.idle_reclaim --days 30 --json benchmarks/results/idle-reclaim.json

benchmark-telemetry: services $(VENV)/.dev | benchmarks/results
	PGPASSWORD=gpupool createdb -h 127.0.0.1 -U gpupool gpupool_bench 2>/dev/null || true
	DATABASE_URL=$(BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/13 SECRET_KEY=bench-only \
		nice $(PY) -m benchmarks.telemetry --mode redis --gpus 10000 --clients 1000 --seconds 30 --warmup 15 \
		--json benchmarks/results/telemetry-redis.json
	nice $(PY) -m benchmarks.telemetry --mode embedded --gpus 10000 --clients 1000 --seconds 30 --warmup 15 \
		--json benchmarks/results/telemetry-embedded.json

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache

# Pool page (Plotly) vs reservations page (no Plotly) in Chromium on the embedded demo, repeat visits.
benchmark-page-load: services $(VENV)/.dev | benchmarks/results
	$(PY) -m benchmarks.page_load --json benchmarks/results/page_load.json

# Issue 24: 10,000 GPUs on 1,250 hosts, 1,000 teams, 200 users and a year of history, served by the Procfile's
# processes and loaded by every host's agent (telemetry at 1 Hz, lease channel) and 200 users, beside the same
# load on an empty portal. Drops and recreates both databases (gpupool_fleet, gpupool_fleet_empty).
FLEET_BENCH_DATABASE_URL ?= postgres://gpupool:gpupool@127.0.0.1:5432/gpupool_fleet

benchmark-fleet: services $(VENV)/.dev | benchmarks/results
	DATABASE_URL=$(FLEET_BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/9 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.fleet --gpus 10000 --teams 1000 --seconds 60 --json benchmarks/results/fleet.json

# Each user call's cost with nothing else running, on the database benchmark-fleet leaves behind (run that first).
benchmark-page-cost: services $(VENV)/.dev | benchmarks/results
	DATABASE_URL=$(FLEET_BENCH_DATABASE_URL) REDIS_URL=redis://127.0.0.1:6379/9 SECRET_KEY=bench-only \
		$(PY) -m benchmarks.page_cost --calls 5 --json benchmarks/results/page-cost.json
