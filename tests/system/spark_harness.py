"""The Spark driver in the fault matrix (F16): its process across runs, its checkpoint, and
the oracle of I14 and of the sink's at-least-once guarantee (docs/reliability.md).

A ``SparkDriver`` (a context manager, used inside a ``harness.Scenario``) runs the query of
``spark_driver`` (the scenario's topic -> an output topic, tidelog source and tidelog sink,
one checkpoint) as a process of its own, one *run* after another: ``start`` begins run
``n + 1``; ``kill_mid_batch`` waits until the run has reported the progress of a batch (Spark
reports a batch once it is committed) and the next batch is in flight (planned:
``offsets/<id>`` is written; not committed: no ``commits/<id>``), lets it run a while, then
SIGKILLs the driver's process group and those its descendants made (the Python driver, its
JVM, Spark's Python workers: a crash of the driver's machine) and records a ``Kill``: the
batch in flight and its planned range, read from the checkpoint once nothing can write it any
more. ``stop`` stops the last run cleanly.

Each output record carries the input's value, the input's ``partition:offset`` as its key and
the run that wrote it in a header. Spark's offsets log holds every batch's planned end (the
driver keeps every entry: ``spark.sql.streaming.minBatchesToRetain``), so every input offset
belongs to exactly one batch. A batch is committed by one run: the run that was running when
its ``commits/<id>`` was written, which the kills' records tell (a run commits every batch
from the first after the last commit it found to the last commit before its kill); a batch
in flight at a kill was also (partly) run by the killed run.

``check_spark`` is the oracle, run after the last run caught up with the high watermarks and
``Scenario.check`` read the final log:

* the sink is at-least-once (README, "The sink"): every record of the final input log is in
  the output, with its value, written by the run that committed its batch (no loss); an
  input record is written by no other run, except by a killed run that had its batch in
  flight (the replay writes it again: the only duplicates allowed); no run writes an input
  record twice, nor anything outside the batches it ran;
* I14: a batch in flight at a kill keeps its planned range (the offsets log after the run is
  what it was at the kill), and the next run replays exactly that range: its progress for the
  batch id reports the same start and end offsets and reads exactly ``end - start`` rows, and
  it writes every offset of the range once (checked by the first point).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from tests.support.cluster import log_tail
from tests.system.harness import SETTLE_TIMEOUT_S, Scenario, wait_until
from tidelog import Consumer, TopicPartition
from tidelog.spark.planning import offsets_from_json

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120.0     # a Spark session and the query's first batches, on a loaded machine
EXIT_TIMEOUT_S = 30.0


# -- the checkpoint ---------------------------------------------------------------------------


class Checkpoint:
    """A query's checkpoint directory, read as Spark writes it: ``offsets/<batch id>`` is
    ``v1``, a metadata line, then one line per source with its offset JSON (the tidelog
    source's ``{topic: {partition: offset}}``); ``commits/<batch id>`` marks a completed batch."""

    def __init__(self, path: Path, topic: str):
        self.path, self.topic = path, topic

    def ids(self, log: str) -> list[int]:
        d = self.path / log
        return sorted(int(f.name) for f in d.iterdir() if f.name.isdigit()) if d.is_dir() else []

    def last(self, log: str) -> int | None:
        ids = self.ids(log)
        return ids[-1] if ids else None

    def committed(self) -> int:
        """The id of the last committed batch, -1 before the first."""
        last = self.last("commits")
        return -1 if last is None else last

    def planned_end(self, batch: int) -> dict[int, int]:
        """``{partition: offset}``: where batch ``batch`` ends (it reads up to, not including, it)."""
        lines = (self.path / "offsets" / str(batch)).read_text().splitlines()
        return {p: o for (t, p), o in offsets_from_json(json.loads(lines[2])).items() if t == self.topic}

    def planned_ends(self) -> dict[int, dict[int, int]]:
        return {b: self.planned_end(b) for b in self.ids("offsets")}


@dataclass(frozen=True)
class Kill:
    """What a SIGKILL of run ``run`` left: the last committed batch, and the batch in flight
    (None when the kill fell between two batches) with its planned ``start`` and ``end``."""

    run: int
    committed: int | None
    in_flight: int | None
    start: dict[int, int] | None = None
    end: dict[int, int] | None = None


# -- the driver process ------------------------------------------------------------------------


class SparkDriver:
    """``spark_driver`` runs of one query (one checkpoint), one at a time."""

    def __init__(self, s: Scenario, directory: Path, sink: str, source_options: dict[str, Any] | None = None):
        self.s, self.directory, self.sink = s, directory, sink
        self.source_options = dict(source_options or {})
        self.checkpoint = Checkpoint(directory / "checkpoint", s.topic)
        self.run = 0
        self.proc: subprocess.Popen | None = None
        self.kills: list[Kill] = []
        directory.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self.proc is not None:
            print(f"== spark driver run {self.run} (log {self.log_path(self.run)}):\n{self.log_tail()}")
        self._kill_group()

    def events_path(self, run: int) -> Path:
        return self.directory / f"run-{run}.jsonl"

    def log_path(self, run: int) -> Path:
        return self.directory / f"run-{run}.log"

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path(self.run), lines)

    def events(self, run: int) -> list[dict]:
        """Every complete event line of a run (a line torn by SIGKILL is never complete)."""
        path = self.events_path(run)
        data = path.read_bytes() if path.exists() else b""
        return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines() if line]

    def progress(self, run: int) -> dict[int, dict]:
        return {e["batch"]: e for e in self.events(run) if e["e"] == "progress"}

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        assert not self.running, "one driver at a time on a checkpoint"
        self.run += 1
        spec = {"bootstrap": self.s.bootstrap, "source": self.s.topic, "sink": self.sink,
                "checkpoint": str(self.checkpoint.path), "work_dir": str(self.directory / f"spark-{self.run}"),
                "events": str(self.events_path(self.run)), "run": self.run, "source_options": self.source_options}
        with open(self.log_path(self.run), "wb") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.system.spark_driver", json.dumps(spec)], cwd=ROOT, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"})
        self.s.note(f"spark driver run {self.run} started (pid {self.proc.pid})")

    def _alive(self) -> bool:
        if not self.running:
            raise AssertionError(f"spark driver run {self.run} exited with {self.proc.returncode}:\n{self.log_tail()}")
        return True

    def wait_batches(self, n: int, timeout: float = START_TIMEOUT_S) -> int:
        """Until the running driver has reported the progress of ``n`` batches (Spark reports a
        batch's progress once it is committed, so the oracle has the progress of a replay);
        returns the last of their ids."""
        def reported():
            self._alive()
            batches = self.progress(self.run)
            return len(batches) >= n and (max(batches),)  # a tuple: batch 0 is a batch too
        return wait_until(reported, timeout, f"spark driver run {self.run} to report {n} batches")[0]

    def kill_mid_batch(self, batches: int = 1, delay_s: float = 0.0, attempts: int = 5) -> Kill:
        """Once the run committed ``batches`` batches: wait for the next batch to be planned,
        let it run ``delay_s``, and SIGKILL the driver's process group while it is still in
        flight. When the batch finished first, the next one is tried with half the delay;
        when the kill fell between two batches after all (the batch finished at that very
        moment), a new run starts and is tried the same way."""
        last = self.wait_batches(batches)
        for _ in range(attempts):
            batch = self._wait_planned(after=last)
            time.sleep(delay_s)
            if self.checkpoint.committed() < batch:
                self._kill_group()
                kill = self._record_kill()
                if kill.in_flight is not None:
                    return kill
                self.start()
                last = self.wait_batches(batches)
            else:
                self.s.note(f"batch {batch} completed within {delay_s:g} s: trying the next one")
                last = batch
            delay_s /= 2
        raise AssertionError(f"no kill of the spark driver fell inside a batch in {attempts} attempts")

    def _wait_planned(self, after: int) -> int:
        """The id of the first batch after batch ``after`` that is planned and not committed."""
        def planned():
            self._alive()
            last = self.checkpoint.last("offsets")
            return last is not None and last > after and self.checkpoint.committed() < last and (last,)
        return wait_until(planned, START_TIMEOUT_S, f"spark driver run {self.run} to plan a batch", interval=0.01)[0]

    def _kill_group(self) -> None:
        """SIGKILL the driver's process group (the driver is a session leader: its pid is the
        group's id) and the groups its descendants made (PySpark's worker daemon makes one for
        its workers), then wait until none of their processes is left. Only groups that still
        have a process are signalled: an empty group's id may belong to someone else by now."""
        if self.proc is None:
            return
        groups = {self.proc.pid}
        if self.proc.poll() is None:  # not reaped: its pid, and so its descendants, are still its own
            groups |= {pgid for _, pgid in _descendants(self.proc.pid)}
        for pgid in groups & {pgid for _, _, pgid in _processes()}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        self.proc.wait(EXIT_TIMEOUT_S)
        wait_until(lambda: not [p for p in _processes() if p[2] in groups], EXIT_TIMEOUT_S,
                   f"the processes of groups {sorted(groups)} to exit")

    def _record_kill(self) -> Kill:
        committed, planned = self.checkpoint.last("commits"), self.checkpoint.last("offsets")
        in_flight = planned if planned is not None and planned != committed else None
        start = end = None
        if in_flight is not None:
            start = self.checkpoint.planned_end(in_flight - 1) if in_flight > 0 else None
            end = self.checkpoint.planned_end(in_flight)
        kill = Kill(self.run, committed, in_flight, start, end)
        self.kills.append(kill)
        what = f"batch {in_flight} in flight, planned {start} -> {end}" if in_flight is not None else "between batches"
        self.s.note(f"SIGKILL spark driver run {self.run}: batch {committed} committed, {what}")
        return kill

    def wait_caught_up(self, ends: dict[int, int], timeout: float = SETTLE_TIMEOUT_S) -> int:
        """Until the last committed batch ends at ``ends`` (the input's high watermarks)."""
        def caught_up():
            self._alive()
            last = self.checkpoint.last("commits")
            return last is not None and self.checkpoint.planned_end(last) == ends and (last,)
        last, = wait_until(caught_up, timeout, f"spark driver run {self.run} to commit up to {ends}")
        self.s.note(f"spark driver run {self.run} committed batch {last}, up to the high watermarks {ends}")
        return last

    def stop(self) -> None:
        """Stop the running driver cleanly (its query, then its session)."""
        Path(str(self.events_path(self.run)) + ".stop").touch()
        status = self.proc.wait(EXIT_TIMEOUT_S + START_TIMEOUT_S)
        self._kill_group()  # what a clean exit left behind, if anything
        assert status == 0, f"spark driver run {self.run} exited with {status}:\n{self.log_tail()}"
        self.s.note(f"spark driver run {self.run} stopped")


def _processes() -> list[tuple[int, int, int]]:
    """``(pid, parent pid, process group)`` of every live process (zombies left out)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid, pgid = stat[stat.rfind(")") + 2:].split()[:3]  # after the command, which may hold spaces
        if state != "Z":
            out.append((int(entry), int(ppid), int(pgid)))
    return out


def _descendants(pid: int) -> list[tuple[int, int]]:
    """``(pid, process group)`` of every live descendant of ``pid``."""
    children: dict[int, list[tuple[int, int]]] = {}
    for p, ppid, pgid in _processes():
        children.setdefault(ppid, []).append((p, pgid))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


# -- the output ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """One output record: the input record it copies and the run that wrote it."""

    run: int
    partition: int
    offset: int
    value: bytes | None


def read_output(bootstrap: str, topic: str, partitions: int, timeout: float = SETTLE_TIMEOUT_S) -> list[Written]:
    """Every record of the output topic, from its start to its high watermarks."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: list[Written] = []
    deadline = time.monotonic() + timeout
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100, default_api_timeout_ms=30000,
                  client_id="system-spark-output") as c:
        ends = {tp.partition: o for tp, o in c.end_offsets(tps).items()}
        c.assign(tps)
        position = {p: 0 for p in ends}
        while any(position[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"the output not read within {timeout} s: at {position}, ends {ends}"
            for r in c.poll(timeout_ms=500):
                if r.offset >= ends[r.partition]:
                    continue
                position[r.partition] = r.offset + 1
                p, o = (int(x) for x in r.key.split(b":"))
                out.append(Written(int(dict(r.headers)["run"]), p, o, r.value))
    return out


# -- the oracle ----------------------------------------------------------------------------------


@dataclass
class SparkReport:
    """What ``check_spark`` found: counts, and up to ``EXAMPLES`` examples of each violation."""

    EXAMPLES = 5

    runs: int = 0
    batches: int = 0
    written: int = 0
    duplicates: int = 0          # output records of an input record already written (replays)
    replayed: list[str] = field(default_factory=list)  # one line per batch in flight at a kill
    # violations
    lost: list = field(default_factory=list)            # an input record its batch's committer did not write
    unexpected: list = field(default_factory=list)      # written by a run that did not run its batch
    twice_in_run: list = field(default_factory=list)    # one run wrote an input record twice
    wrong_value: list = field(default_factory=list)     # output value differs from the input's
    beyond: list = field(default_factory=list)          # output of an offset no committed batch planned
    not_replayed: list = field(default_factory=list)    # I14: a replay planned or read another range

    COUNTS = ("lost", "unexpected", "twice_in_run", "wrong_value", "beyond", "not_replayed")

    def violations(self) -> dict[str, int]:
        return {k: len(getattr(self, k)) for k in self.COUNTS if getattr(self, k)}

    def summary(self) -> str:
        lines = [f"== spark: {self.runs} runs, {self.batches} batches, {self.written} output records, "
                 f"{self.duplicates} duplicates (replays)",
                 "   " + ", ".join(f"{k} {len(getattr(self, k))}" for k in self.COUNTS)]
        lines += [f"   replayed: {r}" for r in self.replayed]
        for k in self.COUNTS:
            lines += [f"   {k}: {example}" for example in getattr(self, k)[:self.EXAMPLES]]
        return "\n".join(lines)

    def assert_ok(self) -> None:
        print(self.summary())
        bad = self.violations()
        assert not bad, f"spark invariants violated: {bad}\n{self.summary()}"
        assert self.replayed, f"no batch was in flight at a kill: nothing was replayed\n{self.summary()}"


def committers(kills: list[Kill], runs: int) -> list[tuple[int, int]]:
    """``[(first batch id, run)]`` in batch order: each run commits the batches from the one
    after the last commit its predecessor left, until its own kill (the last run: to the end)."""
    out, first = [], 0
    for run in range(1, runs + 1):
        out.append((first, run))
        kill = next((k for k in kills if k.run == run), None)
        if kill is not None:
            first = 0 if kill.committed is None else kill.committed + 1
    return out


def batch_ranges(planned: dict[int, dict[int, int]], partitions: int) -> dict[int, tuple[list[int], list[int]]]:
    """Per partition: (the batch ids that read from it, their planned ends), in order."""
    out: dict[int, tuple[list[int], list[int]]] = {p: ([], []) for p in range(partitions)}
    previous = dict.fromkeys(range(partitions), 0)
    for batch in sorted(planned):
        for p, end in planned[batch].items():
            if end > previous.get(p, 0):
                out[p][0].append(batch)
                out[p][1].append(end)
                previous[p] = end
    return out


def batch_of(ranges: dict[int, tuple[list[int], list[int]]], partition: int, offset: int) -> int | None:
    ids, ends = ranges.get(partition, ([], []))
    i = bisect.bisect_right(ends, offset)
    return ids[i] if i < len(ids) else None


def check_spark(final_log: dict[int, dict[int, bytes | None]], planned: dict[int, dict[int, int]],
                committed: int, kills: list[Kill], runs: int, progress: dict[int, dict[int, dict]],
                written: list[Written]) -> SparkReport:
    """The oracle (see the module's docstring). ``planned``: the offsets log after the last
    run ({batch: {partition: end}}); ``committed``: the last committed batch; ``progress``:
    {run: {batch: its progress event}}."""
    report = SparkReport(runs=runs, batches=committed + 1, written=len(written))
    ranges = batch_ranges({b: e for b, e in planned.items() if b <= committed}, len(final_log))
    starts = committers(kills, runs)
    committer = {b: run for i, (first, run) in enumerate(starts)
                 for b in range(first, starts[i + 1][0] if i + 1 < len(starts) else committed + 1)}
    partly = {k.in_flight: k.run for k in kills if k.in_flight is not None}
    _check_written(final_log, ranges, committer, partly, written, report)
    _check_replays(planned, kills, progress, report)
    return report


def _check_written(final_log: dict[int, dict[int, bytes | None]], ranges: dict, committer: dict[int, int],
                   partly: dict[int, int], written: list[Written], report: SparkReport) -> None:
    by_run = Counter((w.run, w.partition, w.offset) for w in written)
    report.twice_in_run = [f"run {r} wrote input {p}:{o} {n} times" for (r, p, o), n in sorted(by_run.items()) if n > 1]
    writers: dict[tuple[int, int], set[int]] = {}
    for w in written:
        writers.setdefault((w.partition, w.offset), set()).add(w.run)
        expected = final_log.get(w.partition, {}).get(w.offset, b"<missing>")
        if w.value != expected:
            report.wrong_value.append(f"run {w.run} wrote {w.value!r} for input {w.partition}:{w.offset}, "
                                      f"which holds {expected!r}")
    report.duplicates = len(written) - len(writers)
    for (p, o), runs in sorted(writers.items()):
        batch = batch_of(ranges, p, o)
        if batch is None:
            report.beyond.append(f"input {p}:{o} written by runs {sorted(runs)}: no committed batch planned it")
            continue
        allowed = {committer[batch]} | ({partly[batch]} if batch in partly else set())
        if not runs <= allowed:
            report.unexpected.append(f"input {p}:{o} (batch {batch}) written by runs {sorted(runs)}; "
                                     f"only runs {sorted(allowed)} ran that batch")
    for p, records in sorted(final_log.items()):
        for o in sorted(records):
            batch = batch_of(ranges, p, o)
            if batch is None or committer[batch] not in writers.get((p, o), ()):
                who = "no committed batch planned it" if batch is None else f"batch {batch}, run {committer[batch]}"
                report.lost.append(f"input {p}:{o} ({who}) is not in the output; written by "
                                   f"{sorted(writers.get((p, o), ()))}")


def _check_replays(planned: dict[int, dict[int, int]], kills: list[Kill], progress: dict[int, dict[int, dict]],
                   report: SparkReport) -> None:
    """I14 for every batch in flight at a kill: the next run replayed the same range."""
    for k in kills:
        if k.in_flight is None:
            continue
        batch, replayer = k.in_flight, k.run + 1
        start = k.start or dict.fromkeys(k.end, 0)
        rows = sum(k.end[p] - start.get(p, 0) for p in k.end)
        if planned.get(batch) != k.end or (batch > 0 and planned.get(batch - 1) != k.start):
            report.not_replayed.append(f"batch {batch}: planned {k.start} -> {k.end} at the kill of run {k.run}, "
                                       f"the offsets log now holds {planned.get(batch - 1)} -> {planned.get(batch)}")
        event = progress.get(replayer, {}).get(batch)
        if event is None:
            report.not_replayed.append(f"batch {batch}: run {replayer} reported no progress for it")
            continue
        seen = (_by_partition(event["start"]) or dict.fromkeys(k.end, 0), _by_partition(event["end"]), event["rows"])
        if seen != (start, k.end, rows):
            report.not_replayed.append(f"batch {batch}: planned {start} -> {k.end} ({rows} records) by run {k.run}, "
                                       f"run {replayer} read {seen[0]} -> {seen[1]} ({seen[2]} rows)")
        report.replayed.append(f"batch {batch}: killed in run {k.run}, replayed by run {replayer}: "
                               f"{start} -> {k.end}, {event['rows']} rows")


def _by_partition(offsets: Any) -> dict[int, int] | None:
    """The source's offset JSON of one topic as ``{partition: offset}``."""
    if not offsets:
        return None
    return {p: o for (_, p), o in offsets_from_json(offsets).items()}
