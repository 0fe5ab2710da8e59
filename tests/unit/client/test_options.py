"""The typed option dictionaries (tidelog.options) against what the clients accept: the
config dataclasses stay the one definition of the options, and these tests fail when a field
is added, removed or retyped on one side only. The package ships ``py.typed``."""

from __future__ import annotations

import dataclasses
import inspect
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import get_type_hints

import pytest

from tidelog import options
from tidelog.aio.admin import AsyncAdmin
from tidelog.aio.consumer import AsyncConsumer
from tidelog.aio.producer import AsyncProducer, ProducerConfig
from tidelog.aio.subscription import ConsumerConfig
from tidelog.security import SecurityConfig

ROOT = Path(__file__).resolve().parents[3]
# where an option's declared type is wider than the field's, because the config parses it
WIDER = {"acks": int | str}


def config_types(config: type) -> dict[str, object]:
    hints = get_type_hints(config)
    return {f.name: WIDER.get(f.name, hints[f.name]) for f in dataclasses.fields(config)
            if f.name != "bootstrap_servers"}


def keywords(fn, *, without: set[str]) -> dict[str, object]:
    """The types of ``fn``'s keyword-only parameters (its ``**options`` annotation names
    what is imported only for type checkers, so each is evaluated on its own)."""
    namespace = vars(sys.modules[fn.__module__])
    return {name: eval(p.annotation, namespace) for name, p in inspect.signature(fn).parameters.items()
            if p.kind is p.KEYWORD_ONLY and name not in without}


@pytest.mark.parametrize("typed, config", [
    (options.SecurityOptions, SecurityConfig),
    (options.ProducerConfigOptions, ProducerConfig),
    (options.ConsumerConfigOptions, ConsumerConfig),
])
def test_the_option_dictionaries_are_the_config_fields(typed, config):
    assert get_type_hints(typed) == config_types(config)


def test_the_constructors_own_keywords_complete_the_options():
    def extra(typed, base):
        return {k: v for k, v in get_type_hints(typed).items() if k not in get_type_hints(base)}

    assert extra(options.ProducerOptions, options.ProducerConfigOptions) == keywords(AsyncProducer.__init__,
                                                                                     without=set())
    assert extra(options.ConsumerOptions, options.ConsumerConfigOptions) == keywords(
        AsyncConsumer.__init__, without={"invoke_callback"})
    assert extra(options.AdminOptions, options.SecurityOptions) == keywords(AsyncAdmin.__init__, without=set())


def test_the_package_ships_py_typed():
    assert (ROOT / "client" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["tidelog"]


MISUSE = """\
from tidelog import Consumer, Producer

Producer("h:1", linger_ms=5, acks="all", value_serializer=lambda v: v.encode())
Producer("h:1", linger_ms="5")
Producer("h:1", linger_msec=5)
Consumer("orders", bootstrap_servers="h:1", group_id="g", value_deserializer=bytes.decode)
Consumer("orders", max_poll_records="many")
"""


def test_mypy_checks_the_options_of_a_call(tmp_path):
    """Run when mypy is installed (it is not a dependency): the installed package is an
    editable one, which mypy cannot follow, so it reads the source through a tree of links."""
    mypy = shutil.which("mypy") or shutil.which("mypy", path=str(Path(sys.executable).parent))
    if mypy is None:
        pytest.skip("mypy is not installed")
    site = tmp_path / "site" / "tidelog"
    site.mkdir(parents=True)
    for entry in (ROOT / "client").iterdir():
        (site / entry.name).symlink_to(entry)
    for folder, name in (("protocol", "protocol"), ("broker", "broker")):
        (site / name).symlink_to(ROOT / folder)
    (tmp_path / "misuse.py").write_text(MISUSE)
    run = subprocess.run([mypy, "--python-version", "3.11", "--follow-imports=silent", "--ignore-missing-imports",
                          "--no-incremental", str(tmp_path / "misuse.py")], capture_output=True, text=True,
                         env={"MYPYPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}, timeout=300)
    flagged = sorted(int(line.split(":")[1]) for line in run.stdout.splitlines() if ": error:" in line)
    assert flagged == [4, 5, 7], run.stdout
