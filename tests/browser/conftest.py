"""Browser tests use the `page` fixture from tests/conftest.py (headless Debian Chromium via Playwright)."""
