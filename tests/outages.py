"""Private Redis and PostgreSQL servers that a test may stop and start: outages on real services.

The suite's shared Redis and PostgreSQL must stay up for every other test, so an outage test
starts its own server on a free port, points the processes under test at it, and stops it
(as an operator's `redis-cli shutdown` or a crashed database would) and starts it again on the
same port and data. Both need the server binaries `scripts/test-services` installs.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import free_port


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


class RedisServer:
    """A redis-server of the test's own, on 127.0.0.1:<port>, no persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="gpupool-redis-"))
        self.process: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def answers(self) -> bool:
        import redis

        try:
            return redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5).ping()
        except redis.RedisError:
            return False

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait(self.answers, 15, "the private Redis to answer")

    def stop(self) -> None:
        """An abrupt outage: the server goes away without saving, as `redis-cli shutdown nosave` does."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if found:
        return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        pytest.fail(f"outage tests need PostgreSQL's {name} (scripts/test-services installs PostgreSQL)")
    return on_path


class PostgresServer:
    """A PostgreSQL cluster of the test's own (initdb in a temporary folder), role and database `gpupool`.

    PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` user.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="gpupool-pg-"))
        self.data = self.dir / "data"
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run([_pg_bin("initdb"), "-D", str(self.data), "-U", "gpupool", "--auth=trust", "-E", "UTF8",
                   "--no-sync"])
        self.started = False

    def _run(self, args: list[str]) -> None:
        subprocess.run(self._as + args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @property
    def url(self) -> str:
        return f"postgres://gpupool:gpupool@127.0.0.1:{self.port}/gpupool"

    def start(self) -> None:
        self._run([_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "postgres.log"), "-w", "-t", "30",
                   "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start"])
        self.started = True

    def create_database(self, name: str = "gpupool") -> None:
        self._run([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "gpupool", name])

    def stop(self) -> None:
        """An abrupt outage: `immediate` drops every connection at once, as a crashed server would."""
        if self.started:
            self._run([_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])
            self.started = False

    def close(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_redis():
    """A started RedisServer the test may stop and start; removed afterwards."""
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
def private_postgres():
    """A started PostgresServer with an empty database `gpupool`; migrate it before use. Removed afterwards."""
    server = PostgresServer()
    server.start()
    server.create_database()
    yield server
    server.close()
