"""``tidelog``'s usage errors: exit status 2, and the message names the (sub)command the
arguments were given to, with that command's usage, so the user sees which options it takes."""

from __future__ import annotations

import pytest

from tidelog.broker.cli import EXIT_USAGE, main


@pytest.mark.parametrize("argv,command,option", [
    (["groups", "describe", "grp"], "tidelog groups describe", "--group GROUP"),
    (["topics", "list", "extra"], "tidelog topics list", "--bootstrap"),
    (["consume", "orders", "more"], "tidelog consume", "--from-beginning"),
])
def test_unrecognized_arguments_are_named_with_the_usage_of_their_subcommand(capsys, argv, command, option):
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{command}: error: unrecognized arguments: {argv[-1]}" in err
    assert err.startswith(f"usage: {command} ") and option in err


def test_an_unknown_command_lists_the_commands(capsys):
    assert main(["version"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid choice: 'version'" in err and "'topics'" in err


@pytest.mark.parametrize("argv,message", [
    (["console", "--port", "0"], "--port must be between 1 and 65535"),
    (["console", "--refresh-ms", "5"], "--refresh-ms must be between 100 and 600000"),
    (["console", "--certfile", "c.pem"], "--certfile and --keyfile go together"),
    (["console", "--login-user", "ops"], "needs TLS"),
    (["console", "--bootstrap", "no-port"], "--bootstrap"),
    (["console", "--login-user", "ops", "--login-password-file", "/nonexistent/pw", "--certfile", "c",
      "--keyfile", "k"], "cannot read /nonexistent/pw"),
])
def test_the_console_refuses_a_bad_configuration_before_it_starts(capsys, argv, message):
    assert main(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err
