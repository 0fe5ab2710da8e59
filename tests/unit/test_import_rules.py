"""The import rules of DESIGN.md section 1, checked on the source tree.

- ``protocol`` imports no other project package, and nothing but the stdlib and msgpack
  (plus the CRC-32C and compression libraries the record batch needs);
- ``broker/log`` knows nothing of networking, Trio or ZooKeeper;
- exactly one module imports ``kazoo``; only ``spark_connector`` imports ``pyspark``;
- ``client`` and ``spark_connector`` never import ``broker``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "broker", "client", "spark_connector")
PROTOCOL_THIRD_PARTY = {"msgpack", "crc32c", "lz4", "zstandard"}
NETWORK_MODULES = {"trio", "kazoo", "socket", "ssl", "asyncio", "selectors", "client"}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out.append((".".join(path.relative_to(ROOT).with_suffix("").parts), path))
    return out


def _imports(path: Path) -> set[str]:
    """Top-level names of every module imported anywhere in the file (also inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.add("<relative>")
    return names


def _full_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


MODULES = _modules()


def test_the_packages_exist():
    assert {name.split(".")[0] for name, _ in MODULES} == set(PACKAGES)


@pytest.mark.parametrize("name,path", [m for m in MODULES if m[0].startswith("protocol")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_protocol_is_self_contained(name, path):
    imported = _imports(path)
    project = imported & (set(PACKAGES) - {"protocol"})
    assert not project, f"{name} imports project packages {project}"
    third = {m for m in imported if m not in sys.stdlib_module_names and m != "protocol"}
    assert third <= PROTOCOL_THIRD_PARTY, f"{name} imports {third - PROTOCOL_THIRD_PARTY}"
    assert not imported & {"socket", "ssl", "trio", "asyncio", "logging", "time"}, \
        f"{name} is sans-IO: no sockets, clocks or logging"


@pytest.mark.parametrize("name,path", [m for m in MODULES if m[0].startswith("broker.log")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_storage_knows_no_networking(name, path):
    bad = _imports(path) & NETWORK_MODULES
    assert not bad, f"{name} imports {bad}"
    assert not any(m.startswith("broker.") and not m.startswith("broker.log")
                   for m in _full_imports(path)), f"{name} imports broker code outside broker.log"


@pytest.mark.parametrize("name,path", [m for m in MODULES if m[0].split(".")[0] in ("client", "spark_connector")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_clients_never_import_the_broker(name, path):
    assert "broker" not in _imports(path), f"{name} imports broker"


def test_only_one_module_imports_kazoo():
    users = [name for name, path in MODULES if "kazoo" in _imports(path)]
    assert len(users) <= 1, f"kazoo is imported by {users}"


def test_only_spark_connector_imports_pyspark():
    users = [name for name, path in MODULES if "pyspark" in _imports(path)]
    assert all(u.startswith("spark_connector") for u in users), users


def test_no_relative_imports():
    users = [name for name, path in MODULES if "<relative>" in _imports(path)]
    assert not users, f"use absolute imports: {users}"


def test_the_rules_catch_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import trio\nfrom broker.log import log\n")
    assert {"trio", "broker"} <= _imports(bad)
