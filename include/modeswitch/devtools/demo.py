"""``make demo``: the pipeline end to end on the embedded default, without a server.

1. Produce a skewed backlog (an hour of event time) into the embedded log, and start a live
   producer.
2. Run the cycle the Airflow DAG runs, with the Spark jobs as child processes: decide ->
   batch epoch (drains the backlog to its boundary) -> stream epoch (starts exactly there) ->
   a burst holds the stream back until the watermark lag crosses the threshold -> batch ->
   stream.
3. Print the epochs with their boundaries and handoffs, the records per mode, the audit of
   the sink plus the quarantine against the source (``modeswitch verify``), and where the data
   lives. Every process started here is stopped here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, EventLog, produce_backlog, produce_live
from modeswitch.ops.verify import audit
from modeswitch.runners.base import EpochRunner
from modeswitch.runners.lifecycle import EpochPlan
from modeswitch.runners.local import LocalRunner
from modeswitch.runners.pipeline_run import open_runner, run_one_epoch
from modeswitch.sources import log_type, open_log
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

LIVE_RATE = 500.0
BURST_RECORDS = 400_000
BURST_AFTER_SECONDS = 25.0

# Scaled to a 2-core machine: a batch epoch of 1 M records takes ~20 s with Spark's start
# (34 s once, beside a stream standby), so the lag it leaves must be under the exit threshold,
# and the stream's first seconds must not take it over the enter threshold (lag 36.9 s after
# that 34 s batch, then a cold first micro-batch: over 45 s, and the stream stopped before it
# caught up). The stream reads at most 2 000 records per micro-batch, so the burst holds it
# back for well over a minute, longer than the enter threshold plus the dwell.
DEMO_SETTINGS = {
    "pipeline": "demo",
    # `modeswitch demo` (make demo-local) shows the local runner: a child process per epoch,
    # each stream handed to a job started in standby. `make demo` shows the engine.
    "engine": "submit",
    # The demo's events, parsed by the default transform (transform = "value_schema").
    "value_schema": EVENT_VALUE_SCHEMA,
    "trigger_interval": "500ms",
    "max_records_per_trigger": "2000",
    "max_stream_runtime": "150s",
    "watermark_lag_threshold": "60s",
    "enter_threshold": "60s",
    "exit_threshold": "45s",
    "enter_dwell": "2s",
    "min_time_in_stream": "5s",
    "min_time_in_batch": "0s",
    "idle_timeout": "30s",
    "wave_records": "400000",
    "max_split_records": "200000",
    "parallelism": "2",
}


def run_demo(
    directory: str, *, records: int, buckets: int, console: Console, kafka: bool = False
) -> int:
    """The demo on the embedded log, or with ``kafka`` on a Kafka topic of ``buckets``
    partitions in an Apache Kafka broker the demo starts and stops itself (one KRaft node
    on loopback, :mod:`modeswitch.devtools.kafka_broker`, its data under ``directory``)."""
    root = Path(directory).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        source = str(root / "log")
        if kafka:
            source = stack.enter_context(demo_broker(root / "kafka", buckets, console))
        settings = PipelineSettings.from_mapping(
            {**DEMO_SETTINGS, "source": source, "warehouse": str(root / "warehouse")}
        )
        console.rule("1. a skewed backlog and a live producer")
        with demo_sources(settings, records=records, buckets=buckets, console=console) as log:
            demo_cycle(settings, log, buckets, console)
        return print_summary(settings, console)


DEMO_TOPIC = "demo-events"


@contextlib.contextmanager
def demo_broker(directory: Path, partitions: int, console: Console) -> Iterator[str]:
    """An Apache Kafka broker on loopback with the demo's topic, for the block: yields the
    source setting. Its address goes to this process's environment
    (``MODESWITCH_KAFKA_CONFIG``), where the jobs started here find it; the variable is
    removed and the broker stopped when the block ends."""
    from modeswitch.devtools.kafka_broker import KafkaBroker
    from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, kafka_environment

    with KafkaBroker(directory) as broker:
        broker.create_topic(DEMO_TOPIC, partitions)
        console.print(
            f"Kafka broker (Apache Kafka, one KRaft node) at {broker.bootstrap}, topic "
            f"{DEMO_TOPIC} with {partitions} partitions"
        )
        os.environ.update(kafka_environment(broker.config))
        try:
            yield f"{SCHEME}{DEMO_TOPIC}"
        finally:
            os.environ.pop(ENV_KAFKA_CONFIG, None)


@contextlib.contextmanager
def demo_sources(
    settings: PipelineSettings,
    *,
    records: int,
    buckets: int,
    console: Console,
    skew: str = "zipf:1.1",
    rate: float = LIVE_RATE,
) -> Iterator[EventLog]:
    """The demo's skewed backlog (an hour of event time), then a live producer thread that is
    stopped and joined when the block ends."""
    # A topic is there already (its broker made it); an embedded log is made here.
    kind = log_type(settings.source)
    log = (
        open_log(settings.source)
        if kind.client_config
        else SegmentLog.create(settings.source, buckets=buckets)
    )
    generator = EventGenerator(
        seed=7, buckets=buckets, skew=skew, late_fraction=0.01, malformed_fraction=0.001
    )
    report = produce_backlog(log, generator, records=records, span=timedelta(hours=1))
    console.print(
        f"{report.records:,} events in {buckets} buckets ({skew}: bucket 0 holds "
        f"{report.per_bucket.get(0, 0):,}), event times over the last hour, "
        f"{report.seconds:.1f} s; live producer at {rate:,.0f} events/s"
    )
    stop_live = threading.Event()
    live = threading.Thread(
        target=produce_live,
        args=(log, EventGenerator(seed=8, buckets=buckets, skew=skew)),
        kwargs={
            "rate": rate,
            "duration": timedelta(hours=1),
            "first": 10_000_000,
            "should_stop": stop_live.is_set,
        },
        name="live-producer",
    )
    live.start()
    try:
        yield log
    finally:
        stop_live.set()
        live.join(timeout=30)
        if kind.client_config:  # its producer goes before the broker does, not retrying
            log.close()  # type: ignore[attr-defined]


@contextlib.contextmanager
def burst_later(
    log: EventLog,
    buckets: int,
    console: Console,
    *,
    after: float = BURST_AFTER_SECONDS,
    records: int = BURST_RECORDS,
) -> Iterator[None]:
    """Append a burst of ``records`` events ``after`` seconds into the block (if it lasts that
    long); the timer is cancelled and joined when the block ends."""

    def burst() -> None:
        produce_backlog(
            log, EventGenerator(seed=9, buckets=buckets), records=records, first=20_000_000
        )
        console.print(f"  [yellow]burst: {records:,} events appended at once[/yellow]")

    timer = threading.Timer(after, burst)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


def _epoch(
    runner: EpochRunner,
    settings: PipelineSettings,
    console: Console,
    note: str,
    job_settings: PipelineSettings | None = None,
) -> None:
    def announce(plan: EpochPlan) -> None:
        if plan.epoch is None:
            console.print(f"decide: {plan.mode} ({plan.reason}); nothing to run")
        else:
            console.print(
                f"[bold]epoch {plan.epoch}: {plan.mode}[/bold] {note}\n  why: {plan.reason}"
            )

    ran = run_one_epoch(
        settings,
        runner,
        decided_by="demo",
        run_settings=(lambda _: job_settings) if job_settings else None,
        on_plan=announce,
    )
    if ran is None:
        return
    plan, status, end = ran
    how, where = "", ""
    if isinstance(runner, LocalRunner):
        if plan.epoch in runner.handed_over:
            how = " (run by the stream job started in standby)"
        where = f" (job log: {runner.log_file(plan.epoch)})"
    console.print(f"  closed {status} at {sum(end.values()):,} records committed{how}{where}")


def demo_cycle(
    settings: PipelineSettings,
    log: EventLog,
    buckets: int,
    console: Console,
    *,
    burst_after: float = BURST_AFTER_SECONDS,
    after_backlog: Callable[[PipelineSettings, float], PipelineSettings] = lambda s, _: s,
) -> None:
    """Batch, stream (a burst ``burst_after`` seconds in holds it back), batch, and a last
    20-second stream: four epochs, each decided by the policy and closed. ``after_backlog``
    gives the settings of the epochs after the first from the first's length in seconds
    (the tests raise the thresholds on a slow machine); the same ones by default."""
    console.rule("2. the pipeline: decide, run, close, decide again")
    logs = Path(settings.warehouse).parent / "logs"
    with open_runner(settings, log_dir=logs, timeout=900) as runner:
        began = time.monotonic()
        _epoch(runner, settings, console, "drains the backlog up to its boundary")
        settings = after_backlog(settings, time.monotonic() - began)
        with burst_later(log, buckets, console, after=burst_after):
            _epoch(runner, settings, console, "from the batch's end offsets, until it falls behind")
        _epoch(runner, settings, console, "drains what the burst left")
        short = PipelineSettings.from_mapping(
            {**settings.to_mapping(), "max_stream_runtime": "20s"}
        )
        _epoch(runner, settings, console, "live again (20 s, then the demo ends)", short)


SPARK_QUERY = """
SELECT date_trunc('MINUTE', event_time) AS minute, action, count(*) AS records,
       round(sum(amount), 2) AS amount
FROM delta.`{sink}`
GROUP BY 1, 2
ORDER BY minute DESC, action
LIMIT 8
"""
"""What ``make demo`` asks the sink at its end, through Delta's own Spark connector."""


def _query_with_spark(settings: PipelineSettings, console: Console) -> None:
    """The sink read as a Spark user reads it: a Spark session with delta-spark (the jars
    every session of ours has, ``modeswitch jars``) and one SQL query."""
    from modeswitch.runners.session import create_spark_session

    query = SPARK_QUERY.format(sink=settings.sink)
    console.print(f"[bold]Spark SQL over the sink (delta-spark):[/bold]{query}")
    spark = create_spark_session(
        "modeswitch-demo-query", master="local[2]", conf={"spark.ui.enabled": "false"}
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        result = spark.sql(query)
        table = Table(title="the newest minutes, per action")
        for name in result.columns:
            table.add_column(name, justify="right")
        for row in result.collect():
            table.add_row(*(str(v) for v in row))
        console.print(table)
    finally:
        spark.stop()


def print_summary(
    settings: PipelineSettings,
    console: Console,
    *,
    verify_with: str = ".venv/bin/modeswitch verify",
    where: str = "",
) -> int:
    """Print what a demo run did: its epochs with their boundaries and handoffs, the records
    per mode, the audit of the sink and the quarantine against the source, a Spark query of
    the sink and where the data lives (``where``: a note on those paths), with the command
    that audits it again (``verify_with``); 0 when the audit found every record exactly once,
    1 otherwise (the demo's exit status). The Airflow demo and the compose demo end with it
    too (:mod:`modeswitch.devtools.airflow_demo`, :mod:`modeswitch.devtools.compose`)."""
    console.rule("3. what happened")
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    epochs = Table(title="epochs (each starts where the previous ended)")
    for name in ("epoch", "mode", "start", "boundary", "end", "handoff", "ended because"):
        epochs.add_column(name, overflow="fold")
    previous_end = None
    per_mode: dict[str, int] = {}
    for epoch in store.epochs.list():
        start, end = sum(epoch.start.values()), sum((epoch.end or {}).values())
        if epoch.end is not None:  # a running epoch has landed nothing it answers for yet
            per_mode[epoch.mode] = per_mode.get(epoch.mode, 0) + end - start
        handoff = (
            "-" if previous_end is None else ("exact" if previous_end == epoch.start else "GAP")
        )
        epochs.add_row(
            str(epoch.id),
            epoch.mode,
            f"{start:,}",
            f"{sum(epoch.boundary.values()):,}" if epoch.boundary else "",
            f"{end:,}" if epoch.end is not None else "running",
            handoff,
            (epoch.end_reason or "")[:70],
        )
        previous_end = epoch.end
    console.print(epochs)
    console.print(
        "records by mode: "
        + ", ".join(f"{mode} {count:,}" for mode, count in sorted(per_mode.items()))
    )
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    t = report.totals
    console.print(
        f"modeswitch verify: {t.expected:,} expected, {t.in_sink:,} in the sink, "
        f"{t.in_quarantine:,} quarantined, {t.missing} missing, {t.duplicated} duplicated, "
        f"{t.out_of_range} out of range -> "
        + ("[green]exactly once[/green]" if report.ok else "[red]DISCREPANCIES[/red]")
    )
    _query_with_spark(settings, console)
    console.print(
        f"data: log {settings.source}\n      sink {settings.sink}\n"
        f"      quarantine {settings.quarantine}\n      control tables {settings.state_root}"
        + (f"\n      {where}" if where else "")
    )
    if log_type(settings.source).client_config:
        console.print(
            "(the demo's broker stops with the demo: on your own broker, verify with its "
            "address in MODESWITCH_KAFKA_CONFIG)"
        )
    console.print(
        f"check it yourself: {verify_with} "
        f"--log {settings.source} --sink {settings.sink} "
        f"--quarantine {settings.quarantine} --pipeline {settings.pipeline}"
    )
    return 0 if report.ok else 1
