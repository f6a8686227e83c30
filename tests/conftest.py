"""Shared test fixtures: paths to the read-only real traces beside the checkout (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "fixtures"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (real traces); skips the test when the folder is absent (a user's clone)."""
    if not SHARED.is_dir():
        pytest.skip("../shared/data is absent (real traces are only beside the development checkout)")
    return SHARED


@pytest.fixture(scope="session")
def shared_data_optional() -> Path | None:
    """``../shared/data`` when present, else None (tests that use it when they can and run without it)."""
    return SHARED if SHARED.is_dir() else None
