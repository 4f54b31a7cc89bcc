"""Shared pytest configuration: where fixtures live."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    """The repository's fixtures/ directory."""
    return FIXTURES
