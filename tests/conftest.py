"""Shared fixtures: the synthetic pack, the real-pack gate, and environment isolation.

* ``synth`` (session): the synthetic pack of :mod:`synthpack`, written once into a temporary
  directory. Pass ``synth.systems_dir`` explicitly as ``systems_path`` everywhere:
  :func:`infercast.data.pack.find_pack` is cached by its argument, so an implicit lookup would
  find whatever pack the first caller found.
* ``real_pack`` marker / ``real_pack_available`` fixture: integration tests that need the
  installed ``aiconfigurator-core`` data pack are skipped cleanly when it is absent.
* an autouse fixture removes ``INFERCAST_SYSTEMS_PATH`` so a developer's shell cannot redirect
  the tests to another pack.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # make `import synthpack` work however pytest is invoked
    sys.path.insert(0, str(TESTS_DIR))

from synthpack import Pack, make_pack  # noqa: E402

REAL_PACK_DISTRIBUTION = "aiconfigurator-core"


def _real_pack_installed() -> bool:
    try:
        metadata.distribution(REAL_PACK_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


REAL_PACK_INSTALLED = _real_pack_installed()

def pytest_configure(config):
    config.addinivalue_line("markers", "real_pack: needs the installed aiconfigurator-core data pack (skipped if absent)")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=f"{REAL_PACK_DISTRIBUTION} (the real perf-data pack) is not installed")
    if REAL_PACK_INSTALLED:
        return
    for item in items:
        if item.get_closest_marker("real_pack") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_pack_env(monkeypatch):
    """Never let $INFERCAST_SYSTEMS_PATH from the caller's shell leak into a test."""
    monkeypatch.delenv("INFERCAST_SYSTEMS_PATH", raising=False)


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Pack:
    """The synthetic pack (built once per session)."""
    return make_pack(tmp_path_factory.mktemp("synthpack"))


@pytest.fixture(scope="session")
def real_pack_available() -> bool:
    """Skip the requesting test when the real pack is not installed; True otherwise."""
    if not REAL_PACK_INSTALLED:
        pytest.skip(f"{REAL_PACK_DISTRIBUTION} (the real perf-data pack) is not installed")
    return True
