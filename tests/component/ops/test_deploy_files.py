"""The files under deploy/ and docs/ that must agree with the code: the generated
configuration reference and env example, the example configs, the systemd unit, the chaos
helpers (run against a stub `docker` that records its commands), and the operations guide's
metric reference."""

from __future__ import annotations

import configparser
import importlib.util
import os
import re
import shutil
import subprocess
import tomllib
import types

import pytest

from tests.component.ops.topology import ROOT
from tidelog.broker.config import ALIASES, REQUIRED, SETTINGS, BrokerConfig

DEPLOY = ROOT / "deploy"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", DEPLOY / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- generated files -----------------------------------------------------------------------------------


def test_configuration_reference_and_env_example_match_the_code():
    """Regenerate both from broker/config.py and compare with the committed files."""
    diffs = _gen_docs().drift()
    assert not diffs, "run `python deploy/gen_docs.py` and commit the result:\n" + "\n".join(diffs)


def test_the_check_command_fails_on_drift(tmp_path, monkeypatch):
    gen = _gen_docs()
    stale = tmp_path / "configuration.md"
    stale.write_text(gen.configuration_md().replace("log.segment.bytes", "log.segment.size"))
    monkeypatch.setattr(gen, "OUTPUTS", {stale: gen.configuration_md})
    assert gen.main(["gen_docs.py", "--check"]) == 1
    assert gen.main(["gen_docs.py"]) == 0 and gen.main(["gen_docs.py", "--check"]) == 0


def test_the_reference_lists_every_setting_and_alias():
    text = (ROOT / "docs" / "configuration.md").read_text()
    for s in (*SETTINGS, *ALIASES):
        assert f"| `{s.name}` |" in text


def test_env_example_lists_every_setting_with_a_default_that_parses_back():
    text = (DEPLOY / "config" / "broker.env.example").read_text()
    gen = _gen_docs()
    for s in SETTINGS:
        var = gen.env_name(s.name)
        m = re.search(rf"^#{var}=(.*)$", text, re.M)
        assert m, f"{var} missing"
        assert f"# {s.name}: " in text and "unit: " in text
        if s.default is REQUIRED or s.default is None:
            assert m.group(1) == ""
            continue
        required = {"TIDELOG_BROKER_ID": "1", "TIDELOG_ZOOKEEPER_CONNECT": "zk:2181"}
        config = BrokerConfig.load(None, env={**required, var: m.group(1)})
        assert getattr(config, s.attr) == s.default, var


def test_every_setting_has_a_unit():
    gen = _gen_docs()
    assert gen.unit_of(next(s for s in SETTINGS if s.name == "replica.lag.time.max.ms")) == "milliseconds"
    assert gen.unit_of(next(s for s in SETTINGS if s.name == "replica.fetch.max.bytes")) == "bytes"
    assert gen.unit_of(next(s for s in SETTINGS if s.name == "offsets.retention.minutes")) == "minutes"
    for s in SETTINGS:
        assert gen.unit_of(s)


# -- example configs --------------------------------------------------------------------------------


# The cluster-node files use SASL between brokers; the broker's password is never in a file
# (compose sets it in the environment).
BROKER_PASSWORD = {"TIDELOG_SASL_JAAS_CONFIG": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                                               'required username="admin" password="not-in-the-file";'}


def test_example_configs_load():
    for path in sorted((DEPLOY / "config").glob("*.toml")):
        config = BrokerConfig.load(path, env=BROKER_PASSWORD)
        assert config.log_dirs == ("/var/lib/tidelog/logs",), path
        assert config.metrics_port == 9404, path
        secrets = {"sasl.jaas.config", "ssl.key.password"} & set(tomllib.loads(path.read_text()))
        assert not secrets, f"{path}: a password in a committed file"


def test_cluster_node_files_differ_only_in_identity_and_addresses():
    props = [BrokerConfig.load(DEPLOY / "config" / f"cluster-node-{n}.toml", env=BROKER_PASSWORD).to_props()
             for n in (1, 2, 3)]
    differing = {k for k in props[0] if len({repr(p[k]) for p in props}) > 1}
    assert differing == {"broker.id", "listeners", "advertised.listeners", "ssl.keystore.location"}
    assert [p["broker.id"] for p in props] == [1, 2, 3]
    assert props[0]["min.insync.replicas"] == 2 and props[0]["default.replication.factor"] == 3
    assert props[0]["unclean.leader.election.enable"] is False


# -- systemd -----------------------------------------------------------------------------------------


UNIT = DEPLOY / "systemd" / "tidelog-broker.service"


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_unit_runs_the_broker_with_a_controlled_shutdown():
    unit = _unit()
    service = unit["Service"]
    assert service["ExecStart"].split()[1:] == ["broker", "--config", "/etc/tidelog/broker.toml"]
    assert service["ExecStart"].split()[0].endswith("/tidelog")
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) >= 120, "time for the controlled shutdown"
    assert service["User"] not in ("root", "0")
    assert "health --config /etc/tidelog/broker.toml --wait" in service["ExecStartPost"]
    assert service["ReadWritePaths"] == "/var/lib/tidelog"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_unit_verifies(tmp_path):
    """systemd's own check (unknown keys, bad values); the executables are replaced by /bin/true
    because the unit's venv does not exist on the test machine."""
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace("/opt/tidelog/venv/bin/tidelog", "/bin/true"))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True,
                       timeout=60)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if UNIT.name in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


# -- chaos helpers ----------------------------------------------------------------------------------

CHAOS = DEPLOY / "chaos" / "chaos.sh"
STUB_DOCKER = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
case "$1" in
  ps) printf 'tidelog-broker-1\\ntidelog-broker-2\\n' ;;
  inspect) case "$*" in *Health*) echo healthy ;; *Running*) echo false ;; *ExitCode*) echo 0 ;; esac ;;
  exec) case "$*" in
          *"tidelog health"*) echo "broker-1:9092: broker ready: 3 brokers [1, 2, 3], controller 3" ;;
          *"topics describe"*) printf 'Topic: orders\\tPartition: 0\\tLeader: 2\\tReplicas: 2,3,1\\tIsr: 2,3,1\\n'
                               printf 'Topic: orders\\tPartition: 10\\tLeader: 1\\tReplicas: 1,2,3\\tIsr: 1,2,3\\n' ;;
        esac ;;
esac
"""


@pytest.fixture
def stub_docker(tmp_path):
    stub = tmp_path / "docker"
    stub.write_text(STUB_DOCKER)
    stub.chmod(0o755)
    log = tmp_path / "docker.log"

    def run(*args: str, dry_run: bool = False):
        env = {**os.environ, "DOCKER": str(stub), "STUB_LOG": str(log), "CHAOS_HEALTHY_TIMEOUT": "5"}
        if log.exists():
            log.unlink()
        r = subprocess.run(["bash", str(CHAOS), *(["-n"] if dry_run else []), *args], capture_output=True,
                           text=True, env=env, timeout=60)
        calls = log.read_text().splitlines() if log.exists() else []
        return types.SimpleNamespace(code=r.returncode, out=r.stdout, err=r.stderr, calls=calls,
                                     changes=[c for c in calls if not c.startswith(("ps", "inspect", "exec"))])

    return run


def test_chaos_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(CHAOS)], check=True)
    assert os.access(CHAOS, os.X_OK)


def test_f1_clean_bounce_sends_sigterm_waits_and_restarts(stub_docker):
    r = stub_docker("bounce", "2")
    assert r.code == 0, r.err
    assert r.changes == ["kill -s TERM tidelog-broker-2", "start tidelog-broker-2"]
    assert any("State.Running" in c for c in r.calls) and any("Health" in c for c in r.calls)


def test_f2_hard_bounce(stub_docker):
    r = stub_docker("hard-bounce", "3", "0")
    assert r.code == 0, r.err
    assert r.changes == ["kill -s KILL tidelog-broker-3", "start tidelog-broker-3"]


def test_f3_kills_the_controller(stub_docker):
    r = stub_docker("kill-controller", "0")
    assert r.code == 0, r.err
    assert r.changes == ["kill -s KILL tidelog-broker-3", "start tidelog-broker-3"]
    assert "controller is broker 3" in r.err


def test_f4_cut_off_and_reconnect_under_the_service_name(stub_docker):
    r = stub_docker("cut-off", "1", "0")
    assert r.code == 0, r.err
    assert r.changes == ["network disconnect tidelog tidelog-broker-1",
                         "network connect --alias broker-1 tidelog tidelog-broker-1"]


def test_f5_isolates_the_partitions_leader(stub_docker):
    r = stub_docker("isolate-leader", "orders", "0", "0")
    assert r.code == 0, r.err
    assert r.changes[0] == "network disconnect tidelog tidelog-broker-2"  # Partition: 0, not 10
    r = stub_docker("leader", "orders", "10")
    assert r.out.strip() == "1"


def test_f6_pause_and_signals(stub_docker):
    r = stub_docker("pause", "1", "0")
    assert r.code == 0, r.err
    assert r.changes == ["pause tidelog-broker-1", "unpause tidelog-broker-1"]
    r = stub_docker("signal", "2", "STOP")
    assert r.changes == ["kill -s STOP tidelog-broker-2"]


def test_dry_run_changes_nothing(stub_docker):
    r = stub_docker("bounce", "2", dry_run=True)
    assert r.code == 0 and r.changes == []
    assert "docker" in r.err or "kill -s TERM tidelog-broker-2" in r.err


def test_bad_arguments_are_usage_errors(stub_docker):
    assert stub_docker("bounce", "broker-2").code == 2
    assert stub_docker("no-such-fault").code == 2
    assert stub_docker().code == 2


# -- the operations guide -------------------------------------------------------------------------------


def test_operations_guide_documents_every_metric(tmp_path):
    """Every family the endpoint exports (with the log cleaner, the group coordinator and the
    event-loop probe present) has a row (name, meaning, when to alert), and a row in the
    table of Kafka counterparts. The process families are the client library's, documented
    together."""
    from tests.component.ops.test_metrics import every_family, family_names

    names = {n for n in family_names(every_family(str(tmp_path))) if not n.startswith("tidelog_process_")}
    guide = (ROOT / "docs" / "operations.md").read_text()
    head, _, rest = guide.partition("### Kafka counterparts")
    counterparts, _, _ = rest.partition("\n### ")
    assert names and all(n.startswith("tidelog_") for n in names) and counterparts
    assert {"tidelog_log_cleaner_cleanings", "tidelog_group_lag", "tidelog_event_loop_lag_seconds"} <= names
    for name in names:
        row = rf"\| `{re.escape(name)}(_total)?(\{{[^`]*\}})?` \|"
        assert re.search(row, head), f"{name} is not documented in docs/operations.md"
        assert re.search(row, counterparts), f"{name} has no row in docs/operations.md's Kafka counterparts"
    assert "configuration.md" in guide and "group lag" in guide.lower()


def test_operations_guide_links_resolve():
    guide = ROOT / "docs" / "operations.md"
    for target in re.findall(r"\]\(([^)#]+)\)", guide.read_text()):
        if "://" not in target:
            assert (guide.parent / target).resolve().exists(), target


def test_operations_guide_metric_tables_are_whole():
    """A blank line inside a table ends it: the rows after it render as raw text. And each
    family has one row among the Kafka counterparts."""
    lines = (ROOT / "docs" / "operations.md").read_text().splitlines()
    for i, line in enumerate(lines[1:], 1):
        if line.startswith("| `tidelog_"):
            assert lines[i - 1].startswith("|"), f"docs/operations.md:{i + 1} is cut from its table"
    counterparts = "\n".join(lines).partition("### Kafka counterparts")[2].partition("\n### ")[0]
    names = [re.sub(r"_total$", "", n) for n in re.findall(r"^\| `(tidelog_\w+)", counterparts, re.M)]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
