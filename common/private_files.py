"""Files only the portal's own account may read: the embedded demo's folder, its SQLite database,
its generated secret key and the demo's passwords.

Created private from the start (never written world-readable and narrowed after), and narrowed
when an earlier version left them open. Imports nothing of Django: settings use it.
"""
from __future__ import annotations

import os
from pathlib import Path


def _narrow(path: Path, mode: int) -> None:
    # Only what we own: PORTAL_VAR_DIR may name a folder someone else set up on purpose.
    if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o777 != mode:
        path.chmod(mode)


def private_dir(path: Path) -> Path:
    """The folder, made (with its parents) readable by this account only (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _narrow(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """The file, made empty if missing, readable by this account only (0600). SQLite gives its journal
    and WAL files the database file's mode, so an empty database file made here keeps those private too."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    _narrow(path, 0o600)
    return path


def write_private(path: Path, text: str) -> None:
    """Write text to a file readable by this account only (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(fd, 0o600)
        file.write(text)
