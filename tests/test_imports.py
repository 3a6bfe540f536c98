"""Imports run one way: the contracts in .importlinter (import-linter), checked on every test run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import BASE_DIR


def test_no_import_runs_backwards():
    lint = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    result = subprocess.run(lint, cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(BASE_DIR)))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
