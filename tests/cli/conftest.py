"""Running `gpupool`, the installed console script, as a subprocess: against the test's live server, or with
no portal at all (help, the catalogues).

The console script is the venv's, installed editable from the main checkout; PYTHONPATH puts this checkout's
cli/ first, so a worktree's tests run the worktree's CLI (the editable finder comes after sys.path). The
locale variables are dropped and set per call, so the language is only what a test asks for."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI_DIR = Path(__file__).resolve().parents[2] / "cli"
GPUPOOL = Path(sys.executable).with_name("gpupool")
LOCALE_VARIABLES = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")


def cli_environment(**values: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("GPUPOOL_") and key not in LOCALE_VARIABLES}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(CLI_DIR), os.environ.get("PYTHONPATH")])),
               LANG="C.UTF-8", TZ="Asia/Shanghai", COLUMNS="80")
    env.update(values)
    return env


def runner(base: dict[str, str]):
    def run(*args: str, stdin: str = "", check: int | None = 0, **env: str) -> subprocess.CompletedProcess:
        """`gpupool *args`; keyword arguments are more environment (LANG="zh_CN.UTF-8")."""
        done = subprocess.run([str(GPUPOOL), *args], input=stdin, capture_output=True, text=True,
                              env={**base, **env}, timeout=120)
        if check is not None:
            assert done.returncode == check, (args, env, done.returncode, done.stdout, done.stderr)
        return done

    return run


@pytest.fixture
def gpupool(live_server, tmp_path):
    assert GPUPOOL.exists(), "the CLI is installed into the venv by requirements-dev.txt (-e ./cli)"
    run = runner(cli_environment(XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path),
                                 GPUPOOL_URL=live_server.url))
    run.config = tmp_path / "config" / "gpupool" / "config.json"
    return run


@pytest.fixture
def offline_gpupool(tmp_path):
    """The CLI with no portal behind it (an address nothing answers at)."""
    return runner(cli_environment(XDG_CONFIG_HOME=str(tmp_path / "config"), HOME=str(tmp_path),
                                  GPUPOOL_URL="http://127.0.0.1:9"))
