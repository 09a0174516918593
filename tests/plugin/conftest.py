"""Tests of the kvconform pytest plugin itself, run in throw-away sessions (pytester)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# ``pytester`` is enabled in tests/conftest.py: pytest refuses ``pytest_plugins`` in a
# conftest below the initial ones (tests/plugin/ is not one when running ``pytest tests``).


@pytest.fixture(autouse=True)
def _clean_kvconform_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner sessions must not inherit the outer run's choices."""
    for name in ("KVCONFORM_SEED", "KVCONFORM_PROFILE", "CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_AUTO_NUM_WORKERS",
                 "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    # Inner sessions run in a temporary directory: make them import this checkout's
    # conformance/ (the installed package may be an editable install of another clone).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
