"""The web console in a real headless browser (Debian's Chromium through Playwright) against
a real 3-broker cluster, as an operator uses it: the overview's brokers, a follower killed
and restarted seen on the partition view, a group's lag rising and falling, a record
produced from the page and read back in the message browser, a topic created from the page
that the CLI then sees, and an action the broker refuses showing the broker's text.

One cluster, one console and one browser for the module. Every page's screenshot is saved
under TIDELOG_TEST_ARTIFACTS/console (a temporary directory without it). The last test
checks that the page never asked any host but the console's own.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.integration.cluster_fixtures import cluster_3
from tests.support.console import Browser, ConsoleProcess, artifacts_dir, browser_problem, poll
from tests.support.waiting import NotYet, wait_until
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.broker.cli import installed_version

__all__ = ["cluster_3"]

pytestmark = pytest.mark.skipif(browser_problem() is not None, reason=str(browser_problem()))


@pytest.fixture(scope="module")
def console(cluster_3, tmp_path_factory) -> Iterator[ConsoleProcess]:
    c = ConsoleProcess(cluster_3.bootstrap, tmp_path_factory.mktemp("console") / "console.log")
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Browser]:
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return artifacts_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def admin(cluster_3) -> Iterator[Admin]:
    with Admin(cluster_3.bootstrap) as a:
        yield a


def open_page(browser: Browser, console: ConsoleProcess, route: str):
    page = browser.page
    page.goto(f"{console.url}/#{route}")
    return page


def confirm(page) -> None:
    page.wait_for_selector("dialog#confirm[open]")
    page.click("#confirm-ok")


def test_the_overview_shows_the_three_brokers(console, browser, artifacts):
    page = open_page(browser, console, "/")
    poll(lambda: page.inner_text("[data-role=broker-count]") == "3", 30, "3 brokers on the overview")
    assert page.locator("[data-role=brokers] tbody tr").count() == 3
    assert page.locator(".badge.ctl").count() == 1  # the controller is marked
    poll(lambda: page.locator("[data-role=brokers] [data-role=version]").all_inner_texts()
         == [installed_version()] * 3, 30, "each broker's version on the overview")
    page.wait_for_timeout(1500)  # a few refreshes: the throughput charts get points
    page.screenshot(path=str(artifacts / "overview.png"), full_page=True)


def test_a_topic_created_from_the_page_exists_for_the_cli(console, browser, cluster_3, artifacts):
    page = open_page(browser, console, "/topics")
    page.wait_for_selector("#create")
    page.fill("#create input[name=name]", "from-the-page")
    page.fill("#create input[name=partitions]", "4")
    page.fill("#create input[name=rf]", "3")
    page.click("[data-role=create-topic]")
    confirm(page)
    page.wait_for_selector("#topics-out .ok")
    r = subprocess.run([sys.executable, "-m", "tidelog.broker.cli", "topics", "describe", "from-the-page",
                        "--bootstrap", cluster_3.bootstrap], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "from-the-page" in r.stdout, r.stdout
    poll(lambda: page.locator('tr[data-topic="from-the-page"]').count() == 1, 30, "the new topic in the list")
    page.screenshot(path=str(artifacts / "topics.png"), full_page=True)


def test_a_refused_action_shows_the_brokers_error_text(console, browser):
    page = open_page(browser, console, "/topics")
    page.wait_for_selector("#create")
    page.fill("#create input[name=name]", "from-the-page")  # exists already
    page.click("[data-role=create-topic]")
    confirm(page)
    error = page.wait_for_selector("[data-role=action-error]")
    assert "already exists" in error.inner_text()


def test_a_record_produced_from_the_page_shows_in_the_message_browser(console, browser, admin, artifacts):
    admin.create_topics([NewTopic("browsed", num_partitions=1, replication_factor=3)])
    wait_until(lambda: [t["name"] for t in console.get("/api/topics?q=browsed").get("items", [])] == ["browsed"],
               30, "the console sees topic browsed")
    page = open_page(browser, console, "/topic/browsed/produce")
    page.fill("#produce input[name=key]", "alice")
    page.fill("#produce textarea[name=value]", '{"paid": 12.5, "items": ["apple"]}')
    page.fill("#produce textarea[name=headers]", "source=console")
    page.click("[data-role=produce]")
    confirm(page)
    assert "offset 0" in page.wait_for_selector("#produce-out .ok").inner_text()
    page.screenshot(path=str(artifacts / "produce.png"), full_page=True)
    page = open_page(browser, console, "/topic/browsed/messages")
    page.select_option("#browse select[name=as]", "json")
    row = page.wait_for_selector('[data-role=records] tr[data-offset="0"]')
    text = row.inner_text()
    assert "alice" in text and '"paid": 12.5' in text and "source" in text
    page.screenshot(path=str(artifacts / "messages.png"), full_page=True)
    by_time = console.get("/api/topics/browsed/records?partition=0&timestamp=0")
    assert by_time["from_offset"] == 0 and [r["key"]["text"] for r in by_time["records"]] == ["alice"]
    later = console.get(f"/api/topics/browsed/records?partition=0&timestamp={by_time['records'][0]['timestamp'] + 1}")
    assert later["records"] == [] and later["from_offset"] == later["high_watermark"] == 1


def test_a_record_with_a_timestamp_no_date_can_hold_still_shows(console, browser, admin, cluster_3):
    """A CreateTime in nanoseconds is a valid int64 but no JavaScript Date: the browser shows
    it as a number, and the other records on the page with it."""
    admin.create_topics([NewTopic("nanos", num_partitions=1, replication_factor=3,  # future stamps allowed
                                  config={"message.timestamp.after.max.ms": str((1 << 63) - 1)})])
    wait_until(lambda: [t["name"] for t in console.get("/api/topics?q=nanos").get("items", [])] == ["nanos"],
               30, "the console sees topic nanos")
    with Producer(cluster_3.bootstrap) as producer:
        producer.send("nanos", b"late", partition=0, timestamp_ms=1_700_000_000_000_000_000).get(30)
        producer.send("nanos", b"usual", partition=0, timestamp_ms=1_700_000_000_000).get(30)
    page = open_page(browser, console, "/topic/nanos/messages")
    first = page.wait_for_selector('[data-role=records] tr[data-offset="0"]').inner_text()
    second = page.wait_for_selector('[data-role=records] tr[data-offset="1"]').inner_text()
    assert "1700000000000000000" in first and "2023-11-14T22:13:20.000Z" in second


def total_lag_is(page, want: str) -> bool | NotYet:
    """The group page shows ``want`` as its total lag; if not, what it shows, and the page's
    status line (the time of its last refresh, or the error that stopped it)."""
    shown = page.inner_text("[data-role=total-lag]")
    return shown == want or NotYet(f"total lag {shown!r}, status {page.inner_text('#status')!r}")


def test_a_groups_lag_rises_while_producing_and_falls_to_zero_after_consuming(console, browser, admin, cluster_3,
                                                                             artifacts):
    admin.create_topics([NewTopic("lagging", num_partitions=3, replication_factor=3)])
    group = "billing"

    def consume_all(expected: int) -> None:
        with Consumer(cluster_3.bootstrap, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False) as consumer:
            consumer.subscribe(["lagging"])
            seen = 0

            def caught_up() -> bool:
                nonlocal seen
                seen += len(consumer.poll(timeout_ms=500))
                return seen >= expected
            wait_until(caught_up, 60, f"{expected} records consumed")
            # every assigned partition's position, those that got no record too: the lag the
            # page sums is over the partitions with a committed offset
            consumer.commit({tp: consumer.position(tp) for tp in consumer.assignment()})

    with Producer(cluster_3.bootstrap, acks="all") as producer:
        producer.send_many("lagging", [b"first"] * 30).result(timeout=30)
    consume_all(30)
    page = open_page(browser, console, f"/group/{group}")
    poll(lambda: total_lag_is(page, "0"), 30, "lag 0 after the first records")
    with Producer(cluster_3.bootstrap, acks="all") as producer:
        producer.send_many("lagging", [b"more"] * 500).result(timeout=30)
    poll(lambda: total_lag_is(page, "500"), 30, "lag 500 after producing")
    page.screenshot(path=str(artifacts / "group-lagging.png"), full_page=True)
    consume_all(500)
    poll(lambda: total_lag_is(page, "0"), 30, "lag back to 0 after consuming")
    page.wait_for_timeout(1000)
    page.screenshot(path=str(artifacts / "group.png"), full_page=True)
    groups = open_page(browser, console, "/groups")
    poll(lambda: groups.locator(f'tr[data-group="{group}"] [data-role=lag]').inner_text() == "0", 30,
         "the group in the list with lag 0")
    groups.screenshot(path=str(artifacts / "groups.png"), full_page=True)
    # the group has no members now: reset it to the earliest offsets from the page
    page = open_page(browser, console, f"/group/{group}")
    page.wait_for_selector("#reset")
    page.select_option("#reset select[name=to]", "earliest")
    page.click("#reset button")
    confirm(page)
    page.wait_for_selector("#reset-out .ok")
    poll(lambda: total_lag_is(page, "530"), 30, "lag 530 after the reset to earliest")


def test_a_config_edit_and_a_topic_deletion_ask_first_and_cancel_does_nothing(console, browser, admin, artifacts):
    admin.create_topics([NewTopic("doomed", num_partitions=1, replication_factor=3)])
    wait_until(lambda: [t["name"] for t in console.get("/api/topics?q=doomed").get("items", [])] == ["doomed"],
               30, "the console sees topic doomed")
    page = open_page(browser, console, "/topic/doomed/configs")
    page.wait_for_selector("#config-edit")
    page.fill("#config-edit input[name=key]", "retention.ms")
    page.fill("#config-edit input[name=value]", "3600000")
    page.click("#config-edit button")
    confirm(page)
    page.wait_for_selector("#config-out .ok")
    assert admin.describe_configs("doomed")["retention.ms"].value == "3600000"
    page.fill("#config-edit input[name=value]", "not-a-number")
    page.click("#config-edit button")
    confirm(page)
    assert "retention.ms" in page.wait_for_selector("[data-role=action-error]").inner_text()
    page.screenshot(path=str(artifacts / "configs.png"), full_page=True)
    page.click("#delete-topic")
    page.wait_for_selector("dialog#confirm[open]")
    page.click("#confirm-cancel")
    assert "doomed" in admin.list_topics()
    page.click("#delete-topic")
    confirm(page)
    page.wait_for_selector("#config-out .ok")
    wait_until(lambda: "doomed" not in admin.list_topics(), 30, "topic doomed deleted")


def test_a_killed_follower_turns_out_of_sync_and_back_after_restart(console, browser, admin, cluster_3, artifacts):
    admin.create_topics([NewTopic("replicated", num_partitions=1, replication_factor=3)])
    wait_until(lambda: admin.describe_topics(["replicated"])[0].partitions[0].leader >= 0, 30, "a leader")
    controller = admin.describe_cluster().controller_id
    (info,) = admin.describe_topics(["replicated"])[0].partitions
    # a follower that is not the controller: its death moves nothing but itself
    follower = next(b for b in info.replicas if b not in (info.leader, controller))
    with Producer(cluster_3.bootstrap, acks="all") as producer:
        producer.send_many("replicated", [b"x" * 100] * 200).result(timeout=30)
    page = open_page(browser, console, "/topic/replicated/partitions")
    replica = f'[data-partition="0"] [data-replica="{follower}"]'
    poll(lambda: page.get_attribute(replica, "data-in-isr") == "true" and page.get_attribute(replica, "data-leo") == "200",
         30, "the follower in sync at LEO 200 first")
    cluster_3.brokers[follower].kill()
    try:
        poll(lambda: page.get_attribute(replica, "data-in-isr") == "false", 60, "the killed follower out of sync")
        with Producer(cluster_3.bootstrap, acks=1) as producer:  # the leader moves on without it
            producer.send_many("replicated", [b"y" * 100] * 300).result(timeout=30)
        leader = f'[data-partition="0"] [data-replica="{info.leader}"]'
        poll(lambda: page.get_attribute(leader, "data-leo") == "500", 30, "the leader at LEO 500")
        # the dead follower stands still at its last known LEO while the leader moves on
        assert page.get_attribute(replica, "data-leo") == "200"
        page.screenshot(path=str(artifacts / "partition-out-of-sync.png"), full_page=True)
    finally:
        cluster_3.brokers[follower].start()
    poll(lambda: page.get_attribute(replica, "data-in-isr") == "true", 90, "the restarted follower back in sync")
    poll(lambda: page.get_attribute(replica, "data-leo") == "500", 30, "the follower caught up to LEO 500")
    page.screenshot(path=str(artifacts / "partition.png"), full_page=True)
    overview = open_page(browser, console, "/")
    poll(lambda: overview.inner_text("[data-role=under-replicated]") == "0", 30, "nothing under-replicated")
    tp = TopicPartition("replicated", 0)
    assert admin.log_end_offsets([tp])[tp] == 500


def test_the_page_asked_no_host_but_the_consoles(console, browser):
    own = urlsplit(console.url).netloc
    hosts = {urlsplit(u).netloc for u in browser.requests if not u.startswith(("data:", "about:", "blob:"))}
    assert browser.requests and hosts == {own}, hosts
