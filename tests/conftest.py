"""What every test shares: its layer marker, from where it lives, and one Hypothesis profile.

A test under tests/<layer>/ is marked ``<layer>`` (unit, component, integration, spark,
system), so ``pytest -m unit`` needs no ``pytestmark`` line per file. A module that belongs
to another layer than its folder says so with its own ``pytestmark`` (the pure planning tests
under tests/spark are ``unit``); such a test keeps its marker and gets no second one.

Property tests run without Hypothesis's per-example deadline: the machine is shared and
small, and a slow example under load is not a failure. Each test still sets its own
``max_examples``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

LAYERS = ("unit", "component", "integration", "spark", "system")
TESTS = Path(__file__).resolve().parent

settings.register_profile("tidelog", deadline=None)
settings.load_profile("tidelog")


def layer_of(path: Path) -> str | None:
    """The layer a test file belongs to by its folder (None outside tests/<layer>/)."""
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in LAYERS else None


def pytest_itemcollected(item: pytest.Item) -> None:
    if any(item.get_closest_marker(name) for name in LAYERS):
        return
    layer = layer_of(item.path)
    if layer is not None:
        item.add_marker(layer)
