"""Static files: compressed (gzip, and Brotli where the brotli package is installed), fingerprinted and
cached for a year by the browsers, through WhiteNoise's manifest storage once `collectstatic` has run
(`make run` runs it at start; a release runs it beside `migrate`)."""
from __future__ import annotations

from pathlib import Path

from whitenoise.storage import CompressedManifestStaticFilesStorage


class PortalStaticStorage(CompressedManifestStaticFilesStorage):
    """WhiteNoise's compressed manifest storage, which names a file that was never collected by its plain
    name instead of failing the page: a checkout that has not run collectstatic (the test suite, a first
    `python -m config.web`) still serves every page, from the source folders (WHITENOISE_USE_FINDERS) with
    a short cache lifetime. `manage.py check --deploy` warns while the manifest is missing."""

    manifest_strict = False

    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:  # not in STATIC_ROOT: collectstatic has not run (or not since the file was added)
            return name

    def manifest_exists(self) -> bool:
        return self.exists(self.manifest_name)


def collected_is_current() -> bool:
    """Whether STATIC_ROOT's manifest is newer than every source static file (collectstatic would change
    nothing), so `make run` only pays for collecting (some seconds) after a change."""
    from django.contrib.staticfiles.finders import get_finders
    from django.contrib.staticfiles.storage import staticfiles_storage

    manifest = Path(staticfiles_storage.path(staticfiles_storage.manifest_name))
    if not manifest.exists():
        return False
    collected_at = manifest.stat().st_mtime
    return all(storage.get_modified_time(path).timestamp() <= collected_at
               for finder in get_finders() for path, storage in finder.list([]))
