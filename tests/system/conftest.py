"""System-test options: ``--soak`` runs every fault scenario longer and with more bounces.

    pytest -m system tests/system            # the fault matrix, bounded (a few minutes)
    pytest -m system tests/system --soak     # SOAK_FACTOR x the bounces and the load time
    TIDELOG_SOAK=1 pytest -m system          # the same, when tests/system is not named
                                             # (pytest registers --soak only from the
                                             # conftest files of the paths given)
"""

from __future__ import annotations

import os

import pytest

SOAK_FACTOR = 4


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help=f"system tests: {SOAK_FACTOR}x the bounces and run time of each fault scenario")


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> int:
    """The multiplier for bounces and load time: 1, or SOAK_FACTOR with ``--soak``."""
    on = request.config.getoption("--soak", default=False) or os.environ.get("TIDELOG_SOAK") == "1"
    return SOAK_FACTOR if on else 1
