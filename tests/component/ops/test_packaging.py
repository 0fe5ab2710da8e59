"""What `pip install .` puts on a machine: one ``tidelog`` package and nothing else.

The folders client/, broker/, protocol/ and spark_connector/ install as ``tidelog``,
``tidelog.broker``, ``tidelog.protocol`` and ``tidelog.spark`` (pyproject.toml's package-dir),
so an application with its own ``client.py`` or ``protocol/`` package neither shadows Tidelog
nor is shadowed by it. The wheel is built from this checkout and installed into an empty
target directory; the dependencies come from the test environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.component.ops.topology import ROOT

FOLDERS = {"client": "tidelog", "broker": "tidelog.broker", "protocol": "tidelog.protocol",
           "spark_connector": "tidelog.spark", "webconsole": "tidelog.webconsole"}


def _declared_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def test_every_package_folder_is_declared_under_its_installed_name():
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *parts]))
    assert found == _declared_packages()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    # the Dockerfile's `pip install --no-deps .`, on a copy so the checkout gets no build/
    source, target = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("site")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--target", str(target), str(source)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return target


def _run_from(app: Path, site: Path, code: str) -> subprocess.CompletedProcess:
    # -I: no user site, no script directory, PYTHON* ignored; then the wheel and the deps only
    deps = [p for p in sys.path if p.endswith("site-packages")]
    boot = f"import sys; sys.path[:0] = {[str(site), *deps]!r}; " + code
    return subprocess.run([sys.executable, "-I", "-c", boot], cwd=app, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": ""})


def test_the_wheel_installs_one_tidelog_package(installed):
    top = {p.name for p in installed.iterdir() if not p.name.endswith((".dist-info", "__pycache__"))}
    assert top == {"tidelog", "bin"} or top == {"tidelog"}
    assert (installed / "tidelog" / "aio" / "__init__.py").exists()
    assert (installed / "tidelog" / "broker" / "cli.py").exists()


def test_the_wheel_ships_the_sdks_type_information(installed):
    assert (installed / "tidelog" / "py.typed").is_file()
    assert (installed / "tidelog" / "options.py").is_file()


def test_the_wheel_ships_the_consoles_page_and_its_chart_library(installed):
    static = installed / "tidelog" / "webconsole" / "static"
    for name in ("index.html", "app.js", "app.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css",
                 "vendor/uPlot-LICENSE"):
        assert (static / name).is_file(), name


def test_an_application_with_its_own_client_and_protocol_modules(installed, tmp_path):
    (tmp_path / "client.py").write_text("MINE = 'client'\n")
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "__init__.py").write_text("MINE = 'protocol'\n")
    r = _run_from(tmp_path, installed,
                  "sys.path.insert(0, ''); "
                  "from tidelog import Producer, Consumer, Admin; from tidelog.aio import AsyncProducer; "
                  "import tidelog.broker.cli, tidelog.protocol.messages; "
                  "import client, protocol; print(client.MINE, protocol.MINE, Producer.__module__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["client", "protocol", "tidelog.blocking"]


def test_the_folder_names_are_not_installed(installed, tmp_path):
    for name in ("client", "protocol", "broker", "spark_connector", "webconsole"):
        r = _run_from(tmp_path, installed, f"import {name}")
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, (name, r.stderr)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_dependencies_are_compatible_ranges_and_the_lock_files_pin_them():
    """pyproject.toml says what works (ranges); the lock files say what CI and the image
    install (exact). Every declared dependency is locked in the lock file of its extra."""
    project = _project()
    groups = {"requirements-lock.txt": project["dependencies"],
              "requirements-spark-lock.txt": project["optional-dependencies"]["spark"],
              "requirements-dev-lock.txt": project["optional-dependencies"]["dev"]}
    for lock, requirements in groups.items():
        pinned = {}
        for line in (ROOT / lock).read_text().splitlines():
            line = line.split("#")[0].split(";")[0].strip()
            if line:
                name, _, version = line.partition("==")
                assert version, f"{lock}: {line!r} is not an exact pin"
                pinned[name.strip().lower().replace("_", "-")] = version
        for req in requirements:
            spec = req.split(";")[0].strip()
            assert "==" not in spec, f"pyproject.toml pins {spec!r}: declare a compatible range"
            assert "<" in spec and ">=" in spec, f"pyproject.toml: {spec!r} needs a lower and an upper bound"
            name = spec.split("[")[0].split(">")[0].split("<")[0].strip().lower()
            assert name in pinned, f"{name} (pyproject.toml) is not pinned in {lock}"
    assert set(project["optional-dependencies"]) == {"spark", "dev"}


def test_requires_python_is_the_version_tested():
    assert _project()["requires-python"] == ">=3.11,<3.12"
    assert sys.version_info[:2] == (3, 11)


def test_the_license_and_the_changelog_ship():
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert _project()["license"] == "Apache-2.0"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and "keepachangelog.com" in changelog


def test_tidelog_version_is_the_installed_version(capsys):
    from importlib.metadata import version

    from tidelog.broker.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"tidelog {version('tidelog')}"


def test_the_wheel_carries_the_license(installed):
    info = next(installed.glob("tidelog-*.dist-info"))
    assert any("Apache License" in p.read_text() for p in info.rglob("LICENSE*"))
