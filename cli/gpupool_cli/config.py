"""Where the portal's address and the token are kept: <config dir>/gpupool/config.json, mode 0600 in
a 0700 folder (click.get_app_dir: ~/.config/gpupool on Linux, honouring XDG_CONFIG_HOME).
GPUPOOL_URL and GPUPOOL_TOKEN in the environment win over the file (for CI jobs)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import click

DEFAULT_URL = "http://127.0.0.1:8000"


def path() -> Path:
    return Path(click.get_app_dir("gpupool")) / "config.json"


def load() -> dict:
    try:
        return json.loads(path().read_text())
    except (FileNotFoundError, ValueError):
        return {}


def save(data: dict) -> Path:
    target = path()
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = target.with_suffix(".tmp")
    # Created 0600 from the start (not chmod-ed after): the token is never readable by others.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(temporary, target)
    return target


def forget() -> bool:
    try:
        path().unlink()
    except FileNotFoundError:
        return False
    return True
