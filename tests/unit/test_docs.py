"""The documentation against the repository: the files it cites exist, and the command
lines its examples show parse with the CLI's parser."""

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tidelog.broker.cli import _chosen_parser, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {Path(line).name for line in out.splitlines()}


def test_the_markdown_files_the_docs_name_exist():
    tracked = _tracked()
    for doc in DOCS:
        for name in re.findall(r"\b[\w.-]+\.md\b", doc.read_text()):
            assert name in tracked, f"{doc.name} names {name}, which is not in the repository"


SUBCOMMANDS = "|".join(re.escape(name) for name in sorted(build_parser()._subparsers._group_actions[0].choices))
COMMAND = re.compile(rf"(?:\.venv/bin/)?tidelog (?:{SUBCOMMANDS})\b[^`#|<>&;$]*")
# an upper-case word stands for a value (NAME, GROUP, HOST:PORT), unless it is a setting
PLACEHOLDER = re.compile(r"(?<![-\w.=])[A-Z][A-Z_:]*[A-Z]\b(?![=.])")


def _example_commands():
    """``tidelog SUBCOMMAND ...`` lines of fenced code blocks (continuations joined) and of
    inline code, a placeholder standing for a value. Lines holding ``...`` are skipped. An
    inline one may be a fragment naming a command, so it only has to use no argument the
    command lacks."""
    for doc in DOCS:
        fenced = False
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            line, start = lines[i], i
            if line.lstrip().startswith("```"):
                fenced = not fenced
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            if fenced:
                found = [(m[0], True) for m in [COMMAND.match(line.strip().removeprefix("$ "))] if m]
            else:
                found = [(m[1], False) for m in re.finditer(r"`([^`]*)`", line) if COMMAND.fullmatch(m[1])]
            for cmd, whole in found:
                if "..." in cmd or "[" in cmd:
                    continue
                yield pytest.param(cmd.strip(), whole, id=f"{doc.name}:{start + 1}")


def _usage_error(argv: list[str]) -> str | None:
    parser = build_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser.parse_known_args(argv)
            if extra:
                _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        return None if e.code in (0, None) else err.getvalue()
    return None


@pytest.mark.parametrize(("cmd", "whole"), list(_example_commands()))
def test_example_commands_parse(cmd, whole):
    # as written (SASL_SSL is a value), else with its placeholders given values
    message = _usage_error(shlex.split(cmd)[1:]) and _usage_error(shlex.split(PLACEHOLDER.sub("x", cmd))[1:])
    fragment = not whole and message and re.search(r"required|expected one argument", message)
    assert not message or fragment, f"{cmd}: {message}"
