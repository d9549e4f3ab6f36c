"""Open a page in a real headless browser for the HTML-report tests (Debian's Chromium)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def find_browser() -> str | None:
    """The Chromium executable on PATH, or None."""
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


#: skip marker for a test that needs the browser
needs_browser = pytest.mark.skipif(find_browser() is None,
                                   reason="no Chromium on this machine (Debian: apt-get install chromium)")


def rendered_dom(html: Path, profile_dir: Path) -> str:
    """The DOM of ``html`` after its scripts ran in headless Chromium; fails the test on a
    non-zero exit or on any JavaScript error the browser's console reported."""
    cmd = [find_browser(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile_dir}",
           "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0", "--dump-dom", html.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln and ("Error" in ln or "Uncaught" in ln)]
    assert not console, console
    return proc.stdout
