"""Broker configuration: the table, the sources and their precedence, errors, TOML round trip."""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.config import (
    ALIASES,
    REQUIRED,
    SETTINGS,
    BrokerConfig,
    ConfigError,
    parse_listener,
    settings_reference,
)
from tidelog.broker.log.config import TOPIC_CONFIGS, InvalidConfigError, LogConfig

MINIMAL = {"broker.id": 1, "zookeeper.connect": "zk1:2181,zk2:2181"}


def load_toml(tmp_path, text: str, overrides=None, env=None) -> BrokerConfig:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return BrokerConfig.load(path, overrides or {}, env=env or {})


def error_of(**kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        BrokerConfig.load(kwargs.pop("path", None), kwargs.pop("overrides", {}), env=kwargs.pop("env", {}))
    return str(info.value)


# -- the table and defaults ---------------------------------------------------------------------


def test_defaults_follow_the_table():
    config = BrokerConfig.from_props(MINIMAL)
    for s in SETTINGS:
        value = getattr(config, s.attr)
        if s.name in MINIMAL:
            assert value == MINIMAL[s.name]
        elif s.default_from:
            assert value == getattr(config, s.default_from.replace(".", "_"))
        else:
            assert value == s.default, s.name


def test_kafka_defaults_where_kafka_has_them():
    c = BrokerConfig.from_props(MINIMAL)
    assert (c.num_partitions, c.default_replication_factor, c.min_insync_replicas) == (1, 1, 1)
    assert c.unclean_leader_election_enable is False and c.auto_create_topics_enable is True
    assert c.zookeeper_session_timeout_ms == c.zookeeper_connection_timeout_ms == 18000
    assert c.zookeeper_chroot == "/tidelog"
    assert c.replica_lag_time_max_ms == 30000 and c.replica_fetch_max_bytes == 1024 * 1024
    assert c.socket_request_max_bytes == 100 * 1024 * 1024
    assert c.connections_max_idle_ms == 600000 and c.metrics_port == -1
    assert c.offsets_topic_num_partitions == 50 and c.offsets_topic_replication_factor == 3
    assert c.log_segment_bytes == 1024**3 and c.log_retention_ms == 7 * 24 * 3600 * 1000
    assert c.message_max_bytes == 1024 * 1024 + 12 and c.log_cleanup_policy == "delete"


def test_every_topic_config_default_has_its_broker_setting():
    names = {s.name for s in SETTINGS}
    assert {d.broker_key for d in TOPIC_CONFIGS if d.broker_key} <= names


def test_attributes_are_the_names_with_underscores_and_the_object_is_frozen():
    config = BrokerConfig.from_props(MINIMAL)
    assert [f.name for f in dataclasses.fields(config)] == [s.name.replace(".", "_") for s in SETTINGS]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.broker_id = 2


def test_log_config_maps_broker_defaults_to_topic_configs():
    config = BrokerConfig.from_props({**MINIMAL, "log.segment.bytes": 4096, "log.roll.hours": 1,
                                      "log.retention.bytes": 10**9, "log.cleanup.policy": "compact",
                                      "message.max.bytes": 2000, "min.insync.replicas": 2,
                                      "log.message.timestamp.type": "LogAppendTime",
                                      "unclean.leader.election.enable": True,
                                      "log.index.interval.bytes": 100, "log.flush.interval.messages": 5})
    log = config.log_config()
    assert isinstance(log, LogConfig)
    assert (log.segment_bytes, log.segment_ms, log.retention_bytes) == (4096, 3600000, 10**9)
    assert (log.cleanup_policy, log.max_message_bytes, log.min_insync_replicas) == ("compact", 2000, 2)
    assert log.log_append_time and log.unclean_leader_election_enable
    assert (log.index_interval_bytes, log.flush_messages) == (100, 5)
    assert BrokerConfig.from_props(MINIMAL).log_config() == LogConfig()


def test_settings_reference_lists_every_setting_and_alias():
    text = settings_reference()
    for name in [s.name for s in SETTINGS] + [a.name for a in ALIASES]:
        assert f"`{name}`" in text


# -- the TOML file ------------------------------------------------------------------------------


def test_dotted_keys_tables_and_quoted_keys_flatten_to_kafka_names(tmp_path):
    config = load_toml(tmp_path, """
broker.id = 3
zookeeper.connect = "zk:2181"
log.segment.bytes = 1048576
"log.retention.bytes" = 5000
listeners = "PLAINTEXT://127.0.0.1:9093"

[num]
partitions = 6

[replica.fetch]
max.bytes = 2048
wait.max.ms = 100
""")
    assert (config.broker_id, config.log_segment_bytes, config.log_retention_bytes) == (3, 1048576, 5000)
    assert (config.num_partitions, config.replica_fetch_max_bytes, config.replica_fetch_wait_max_ms) == (6, 2048, 100)
    assert config.listener == ("127.0.0.1", 9093) == config.advertised


def test_log_dirs_as_a_list_or_a_comma_separated_string(tmp_path):
    base = 'broker.id = 1\nzookeeper.connect = "z"\n'
    assert load_toml(tmp_path, base + 'log.dirs = ["/a", "/b"]').log_dirs == ("/a", "/b")
    assert load_toml(tmp_path, base + 'log.dirs = "/a, /b"').log_dirs == ("/a", "/b")
    assert load_toml(tmp_path, base + 'log.dir = "/c"').log_dirs == ("/c",)
    assert load_toml(tmp_path, base + 'log.dir = "/c"\nlog.dirs = "/d"').log_dirs == ("/d",)
    assert BrokerConfig.from_props({**MINIMAL, "log.dirs": ("/e",)}).log_dirs == ("/e",)


def test_a_log_dir_named_twice_is_refused(tmp_path):
    """As Kafka ("Duplicate log directory found"), by real path: a broker given one dir twice
    ran once, then could never start again (its partitions "found in two log directories")."""
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "link").symlink_to(data)
    for dirs in ([f"{data}", f"{data}/"], [f"{data}", f"{tmp_path}/./data"], [f"{data}", f"{tmp_path}/link"]):
        message = error_of(overrides={**MINIMAL, "log.dirs": ",".join(dirs)})
        assert message.startswith("log.dirs = "), message
        assert f"duplicate log directory found: {dirs[0]!r} and {dirs[1]!r} are both {os.path.realpath(data)}" in message
    other = tmp_path / "other"
    config = BrokerConfig.from_props({**MINIMAL, "log.dirs": [str(data), str(other)]})
    assert config.log_dirs == (str(data), str(other))


def test_strings_in_the_file_are_parsed_as_the_settings_type(tmp_path):
    config = load_toml(tmp_path, 'broker.id = "4"\nzookeeper.connect = "z"\n'
                                 'delete.topic.enable = "false"\nlog.cleaner.min.cleanable.ratio = 1')
    assert config.broker_id == 4 and config.delete_topic_enable is False
    assert config.log_cleaner_min_cleanable_ratio == 1.0


def test_unknown_key_in_the_file_is_an_error_with_a_suggestion(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown setting 'log\.segment\.byte' \(in .*broker\.toml\); "
                                          r"did you mean 'log\.segment\.bytes'\?"):
        load_toml(tmp_path, 'broker.id = 1\nzookeeper.connect = "z"\nlog.segment.byte = 5')
    with pytest.raises(ConfigError, match=r"unknown setting 'completely\.different'") as info:
        load_toml(tmp_path, 'broker.id = 1\nzookeeper.connect = "z"\n[completely]\ndifferent = 1')
    assert "did you mean" not in str(info.value)


def test_a_key_set_twice_through_dotted_and_quoted_keys_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"num\.partitions is set twice"):
        load_toml(tmp_path, 'broker.id = 1\nzookeeper.connect = "z"\n"num.partitions" = 1\nnum.partitions = 2')


def test_unreadable_and_invalid_files_name_the_file(tmp_path):
    message = error_of(path=tmp_path / "missing.toml")
    assert "missing.toml" in message and "cannot read" in message
    with pytest.raises(ConfigError, match=r"broker\.toml is not valid TOML"):
        load_toml(tmp_path, "broker.id = = 1")


def test_a_config_of_the_wrong_type_names_key_value_source_and_expectation(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_toml(tmp_path, 'broker.id = 1\nzookeeper.connect = "z"\nnum.partitions = true')
    assert str(info.value) == f"num.partitions = True (in {tmp_path / 'broker.toml'}): expected an integer >= 1"


# -- environment and overrides ------------------------------------------------------------------


def test_precedence_is_file_then_env_then_set(tmp_path):
    text = 'broker.id = 1\nzookeeper.connect = "z"\nnum.partitions = 2\nlog.segment.bytes = 100000\nbroker.rack = "r1"'
    env = {"TIDELOG_NUM_PARTITIONS": "3", "TIDELOG_LOG_SEGMENT_BYTES": "200000"}
    config = load_toml(tmp_path, text, {"log.segment.bytes": "300000"}, env)
    assert (config.num_partitions, config.log_segment_bytes, config.broker_rack) == (3, 300000, "r1")


def test_env_names_every_setting_and_other_variables_are_ignored():
    env = {"TIDELOG_BROKER_ID": "9", "TIDELOG_ZOOKEEPER_CONNECT": "zk:1",
           "TIDELOG_AUTO_CREATE_TOPICS_ENABLE": "false", "TIDELOG_LOG_RETENTION_HOURS": "2",
           "TIDELOG_BOOTSTRAP": "localhost:9092", "TIDELOG_NOT_A_SETTING": "x",
           "NUM_PARTITIONS": "7", "tidelog_num_partitions": "8"}
    config = BrokerConfig.load(None, env=env)
    assert (config.broker_id, config.zookeeper_connect) == (9, "zk:1")
    assert config.auto_create_topics_enable is False and config.log_retention_ms == 2 * 3600 * 1000
    assert config.num_partitions == 1


def test_a_bad_env_value_names_the_variable_and_the_key():
    message = error_of(overrides=MINIMAL, env={"TIDELOG_NUM_PARTITIONS": "many"})
    assert message == "num.partitions = 'many' (from env TIDELOG_NUM_PARTITIONS): expected an integer >= 1"


def test_unknown_set_key_is_an_error():
    assert error_of(overrides={**MINIMAL, "num.partition": "3"}) == (
        "unknown setting 'num.partition' (from --set); did you mean 'num.partitions'?")


def test_missing_required_settings_say_how_to_set_them():
    message = error_of(overrides={"zookeeper.connect": "z"})
    assert "missing required setting broker.id" in message and "TIDELOG_BROKER_ID" in message
    assert "zookeeper.connect" in error_of(overrides={"broker.id": "1"})


def test_an_empty_string_unsets_an_optional_setting():
    assert BrokerConfig.load(None, {**MINIMAL, "broker.rack": ""}, env={"TIDELOG_BROKER_RACK": "r"}).broker_rack is None


# -- Kafka's unit variants ------------------------------------------------------------------------


@pytest.mark.parametrize("props,retention_ms", [
    ({"log.retention.hours": 1}, 3_600_000),
    ({"log.retention.minutes": 30}, 1_800_000),
    ({"log.retention.minutes": 30, "log.retention.hours": 1}, 1_800_000),  # minutes beat hours
    ({"log.retention.ms": 5, "log.retention.minutes": 30, "log.retention.hours": 1}, 5),  # ms beats both
    ({"log.retention.hours": -1}, -1),  # no time limit, as in Kafka
    ({"log.retention.minutes": "-5"}, -1),
    ({}, 168 * 3_600_000),
])
def test_retention_in_hours_and_minutes(props, retention_ms):
    assert BrokerConfig.from_props({**MINIMAL, **props}).log_retention_ms == retention_ms


def test_roll_hours():
    assert BrokerConfig.from_props({**MINIMAL, "log.roll.hours": 2}).log_roll_ms == 7_200_000
    assert BrokerConfig.from_props({**MINIMAL, "log.roll.ms": 5, "log.roll.hours": 2}).log_roll_ms == 5
    assert error_of(overrides={**MINIMAL, "log.roll.hours": "0"}) == (
        "log.roll.hours = '0' (from --set): expected an integer >= 1")


def test_a_later_source_wins_whichever_unit_it_uses(tmp_path):
    text = 'broker.id = 1\nzookeeper.connect = "z"\nlog.retention.ms = 1000\nlog.roll.hours = 1'
    config = load_toml(tmp_path, text, {"log.roll.ms": "5"}, {"TIDELOG_LOG_RETENTION_HOURS": "2"})
    assert (config.log_retention_ms, config.log_roll_ms) == (7_200_000, 5)


def test_a_bad_variant_value_names_the_variant():
    assert error_of(overrides={**MINIMAL, "log.retention.hours": "a day"}) == (
        "log.retention.hours = 'a day' (from --set): expected an integer")


# -- every error names the key ----------------------------------------------------------------------


def _bad_values(s) -> list:
    wrong_type = {int: ["twelve", True, 1.5], float: ["half", True], bool: ["yes", 1],
                  str: [5, ["x"]], tuple: [5, [1, 2]]}[s.type]
    out = list(wrong_type)
    if s.minimum is not None:
        out.append(s.minimum - 1)
    if s.maximum is not None:
        out.append(s.maximum + 1)
    if s.choices:
        out.append("bogus")
    if s.check is not None and not s.optional:  # "" unsets an optional setting
        out.append(["", " "] if s.type is tuple else "")
    elif s.check is not None:
        out.append(["", " "] if s.type is tuple else ",")
    return out


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_every_invalid_value_names_the_key_and_the_value(setting):
    for bad in _bad_values(setting):
        with pytest.raises(ConfigError) as info:
            BrokerConfig.from_props({**MINIMAL, setting.name: bad})
        message = str(info.value)
        shown = "***" if setting.sensitive else repr(bad)  # a secret's value is never echoed
        assert message.startswith(f"{setting.name} = {shown} (in the given properties): "), message
        assert "expected" in message or "supported" in message, message


def test_config_errors_are_invalid_config_errors():
    with pytest.raises(InvalidConfigError) as info:
        BrokerConfig.from_props({**MINIMAL, "num.partitions": 0})
    assert info.value.error.name == "INVALID_CONFIG"


# -- listeners ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,parsed", [
    ("PLAINTEXT://127.0.0.1:9092", ("PLAINTEXT", "127.0.0.1", 9092)),
    ("plaintext://broker-1.example:0", ("PLAINTEXT", "broker-1.example", 0)),
    ("PLAINTEXT://[::1]:9093", ("PLAINTEXT", "::1", 9093)),
    ("PLAINTEXT://:9092", ("PLAINTEXT", "", 9092)),
])
def test_parse_listener(text, parsed):
    assert parse_listener(text) == parsed


@pytest.mark.parametrize("bad,why", [
    ("127.0.0.1:9092", "NAME://host:port"),
    ("CLIENT://127.0.0.1:9092", "listener CLIENT has no security protocol"),
    ("PLAINTEXT://h:70000", "port from 0 to 65535"),
    ("PLAINTEXT://h:port", "port from 0 to 65535"),
    ("PLAINTEXT://a:1,PLAINTEXT://b:2", "listener name PLAINTEXT appears twice"),
    ("PLAINTEXT://a:1,SSL://b:1", "port 1 is used by two listeners"),
])
def test_bad_listeners_name_the_key(bad, why):
    message = error_of(overrides={**MINIMAL, "listeners": bad})
    assert message.startswith(f"listeners = {bad!r} (from --set): ") and why in message


def test_advertised_listener_defaults_to_the_listener_and_can_differ():
    c = BrokerConfig.from_props({**MINIMAL, "listeners": "PLAINTEXT://0.0.0.0:9092",
                                 "advertised.listeners": "PLAINTEXT://broker1:19092"})
    assert c.listener == ("0.0.0.0", 9092) and c.advertised == ("broker1", 19092)
    c = BrokerConfig.from_props({**MINIMAL, "listeners": "PLAINTEXT://:9092"})
    assert c.listener == ("", 9092) and c.advertised == (socket.gethostname(), 9092)


def test_kafka_listeners_live_beside_the_native_ones_under_their_own_names():
    c = BrokerConfig.from_props({**MINIMAL, "listeners": "PLAINTEXT://127.0.0.1:9092",
                                 "kafka.listeners": "PLAINTEXT://127.0.0.1:9192,SASL_SSL://127.0.0.1:9193",
                                 "kafka.advertised.listeners": "PLAINTEXT://kafka.example:9192",
                                 "ssl.keystore.location": "/k.pem"})
    kafka = [x for x in c.listener_list if x.wire == "kafka"]
    assert [(x.name, str(x.protocol), x.advertised.host, x.advertised.port, x.inter_broker) for x in kafka] == [
        ("KAFKA_PLAINTEXT", "PLAINTEXT", "kafka.example", 9192, False),
        ("KAFKA_SASL_SSL", "SASL_SSL", "127.0.0.1", 9193, False)]
    assert c.inter_broker_listener.name == "PLAINTEXT" and c.inter_broker_listener.wire == "tidelog"


@pytest.mark.parametrize("settings,key,why", [
    ({"kafka.listeners": "PLAINTEXT://127.0.0.1:9092"}, "kafka.listeners",
     "port 9092 is used by a listener in listeners and by Kafka listener PLAINTEXT"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,KAFKA_X://127.0.0.1:9093",
      "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,KAFKA_X:PLAINTEXT,X:PLAINTEXT",
      "kafka.listeners": "X://127.0.0.1:9192"}, "kafka.listeners", "would be called KAFKA_X"),
    ({"kafka.listeners": "CLIENT://127.0.0.1:9192"}, "kafka.listeners", "Kafka listener CLIENT has no security"),
    ({"kafka.listeners": "PLAINTEXT://127.0.0.1:9192", "kafka.advertised.listeners": "SSL://h:1"},
     "kafka.advertised.listeners", "Kafka advertised listener SSL is not in kafka.listeners"),
    ({"kafka.advertised.listeners": "PLAINTEXT://h:1"}, "kafka.advertised.listeners",
     "kafka.advertised.listeners is set but kafka.listeners is not"),
])
def test_bad_kafka_listeners_name_the_key(settings, key, why):
    message = error_of(overrides={**MINIMAL, **settings})
    assert message.startswith(f"{key} = ") and why in message, message


def test_a_wildcard_address_cannot_be_advertised():
    message = error_of(overrides={**MINIMAL, "listeners": "PLAINTEXT://0.0.0.0:9092"})
    assert message.startswith("listeners = 'PLAINTEXT://0.0.0.0:9092' (from --set): 0.0.0.0 cannot be advertised")
    message = error_of(overrides={**MINIMAL, "advertised.listeners": "PLAINTEXT://[::]:9092"})
    assert message.startswith("advertised.listeners = ")


def test_chroot_must_be_an_absolute_path():
    assert BrokerConfig.from_props({**MINIMAL, "zookeeper.chroot": "/"}).zookeeper_chroot == "/"
    for bad in ("tidelog", "/tidelog/"):
        assert error_of(overrides={**MINIMAL, "zookeeper.chroot": bad}).startswith(f"zookeeper.chroot = {bad!r}")


JAAS = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="b" password="p";'


def test_the_inter_broker_sasl_mechanism_must_be_enabled_when_brokers_use_sasl():
    """As Kafka: brokers would offer only sasl.enabled.mechanisms, so every inter-broker
    handshake in another mechanism would fail."""
    sasl = {**MINIMAL, "listeners": "SASL_PLAINTEXT://127.0.0.1:9092", "sasl.jaas.config": JAAS}
    message = error_of(overrides={**sasl, "sasl.enabled.mechanisms": "PLAIN"})
    assert message == ("sasl.mechanism.inter.broker.protocol = 'SCRAM-SHA-256' (default): must be "
                       "included in sasl.enabled.mechanisms ('PLAIN') when SASL is used for inter-broker "
                       "communication (listener SASL_PLAINTEXT)")
    ok = BrokerConfig.from_props({**sasl, "sasl.enabled.mechanisms": "PLAIN, SCRAM-SHA-512",
                                  "sasl.mechanism.inter.broker.protocol": "PLAIN"})
    assert ok.sasl_mechanism_inter_broker_protocol == "PLAIN"
    # no SASL between brokers: the mechanism is not used, whatever it is
    both = "PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://127.0.0.1:9093"
    assert BrokerConfig.from_props({**MINIMAL, "listeners": both, "sasl.enabled.mechanisms": "PLAIN",
                                    "inter.broker.listener.name": "PLAINTEXT"})


# -- settings checked against each other -----------------------------------------------------------


def test_the_request_memory_budget_is_unbounded_at_zero_or_below_else_at_least_one_frame():
    """As Kafka: queued.max.request.bytes <= 0 is no bound; a bound below socket.request.max.bytes
    would refuse the frames between the two (at 0, every request)."""
    for unbounded in (0, -1, -5):
        assert BrokerConfig.from_props({**MINIMAL, "queued.max.request.bytes": unbounded})
    exact = {**MINIMAL, "socket.request.max.bytes": 5000, "queued.max.request.bytes": 5000}
    assert BrokerConfig.from_props(exact).queued_max_request_bytes == 5000
    message = error_of(overrides={**MINIMAL, "queued.max.request.bytes": 1000})
    assert message == ("queued.max.request.bytes = 1000 (from --set): must be at least socket.request.max.bytes "
                       "(104857600), or 0 or below for no bound: a larger request could never be received")
    message = error_of(overrides={**MINIMAL, "socket.request.max.bytes": 300 * 2**20})
    assert message.startswith("queued.max.request.bytes = 209715200 (default): must be at least "
                              "socket.request.max.bytes (314572800)")


# -- TOML round trip --------------------------------------------------------------------------------


def _rich_config() -> BrokerConfig:
    return BrokerConfig.from_props({
        **MINIMAL, "broker.rack": 'rack "a" \\ b\n\tc é 日本 \x7f', "log.dirs": ["/data/1", "/data/2"],
        "listeners": "PLAINTEXT://127.0.0.1:19092", "advertised.listeners": "PLAINTEXT://b1:9092",
        "log.segment.bytes": 2**20, "log.retention.ms": -1, "unclean.leader.election.enable": True,
        "auto.create.topics.enable": False, "log.cleaner.min.cleanable.ratio": 0.25,
        "log.cleanup.policy": "compact,delete", "zookeeper.connection.timeout.ms": 999})


@pytest.mark.parametrize("include_defaults", [False, True])
def test_to_toml_round_trips(tmp_path, include_defaults):
    config = _rich_config()
    text = config.to_toml(include_defaults=include_defaults)
    assert load_toml(tmp_path, text) == config


def test_to_toml_writes_only_what_differs_from_the_defaults():
    table = tomllib.loads(BrokerConfig.from_props(MINIMAL).to_toml())
    assert table == {"broker": {"id": 1}, "zookeeper": {"connect": "zk1:2181,zk2:2181"}}
    rich = _rich_config().to_toml()
    assert "zookeeper.connection.timeout.ms = 999" in rich and "num.partitions" not in rich


def test_to_toml_with_defaults_writes_every_set_value():
    text = BrokerConfig.from_props(MINIMAL).to_toml(include_defaults=True)
    written = {line.split(" = ")[0].strip('"') for line in text.splitlines() if " = " in line}
    expected = {s.name for s in SETTINGS if s.default is not None or s.default_from or s.default is REQUIRED}
    assert written == expected


@given(rack=st.text(min_size=1), connect=st.text().map(lambda s: "zk:2181/" + s),
       dirs=st.lists(st.text(min_size=1).filter(lambda s: s.strip() == s and s and "," not in s and "\0" not in s),
                     min_size=1, max_size=3, unique_by=os.path.realpath))
def test_to_toml_round_trips_any_strings(rack, connect, dirs):
    config = BrokerConfig.from_props({"broker.id": 0, "zookeeper.connect": connect,
                                      "broker.rack": rack, "log.dirs": dirs})
    assert BrokerConfig.from_props(_flatten(tomllib.loads(config.to_toml()))) == config


def _flatten(table, prefix=""):
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out
