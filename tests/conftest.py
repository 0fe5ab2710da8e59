"""What every test shares: its layer marker, from where it lives, and one Hypothesis profile.

A test under tests/<layer>/ is marked ``<layer>`` (unit, component, integration, spark,
system), so ``pytest -m unit`` needs no ``pytestmark`` line per file. A module that belongs
to another layer than its folder says so with its own ``pytestmark`` (the pure planning tests
under tests/spark are ``unit``); such a test keeps its marker and gets no second one.

Property tests run without Hypothesis's per-example deadline: the machine is shared and
small, and a slow example under load is not a failure. Each test still sets its own
``max_examples``.

``--fuzz-seconds`` and ``--fuzz-seed`` set the broker fuzzer's run (tests/integration/test_fuzz.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

LAYERS = ("unit", "component", "integration", "spark", "system")
TESTS = Path(__file__).resolve().parent

settings.register_profile("tidelog", deadline=None)
settings.load_profile("tidelog")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fuzz", "the broker fuzzer (tests/integration/test_fuzz.py)")
    group.addoption("--fuzz-seconds", type=float, default=None,
                    help="fuzz for this many seconds (default: a short slice, two seeds)")
    group.addoption("--fuzz-seed", type=int, default=None,
                    help="fuzz with this seed only (default: a fixed seed, then a random one)")


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
