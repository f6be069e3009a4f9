"""The ``modeswitch`` command line: produce synthetic events, inspect a log, run the demo or a
pipeline, show a pipeline's status, audit it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rich.table import Table

from modeswitch.cli_log import (
    StopFlag,
    _add_offsets,
    _add_produce,
    _add_retain,
    _offsets,
    _produce,
    _retain,
    console,
    errors,
)
from modeswitch.control.settings import parse_duration
from modeswitch.errors import ModeswitchError


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the pipeline end to end on the embedded default")
    p.add_argument("--dir", default=".demo", help="where the demo's data lives")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--buckets", type=int, default=16)
    p.add_argument(
        "--kafka",
        action="store_true",
        help="read a Kafka topic (buckets = partitions) of a broker the demo starts and stops",
    )


def _demo(args: argparse.Namespace) -> int:
    from modeswitch.devtools.demo import run_demo

    return run_demo(
        args.dir, records=args.records, buckets=args.buckets, console=console, kafka=args.kafka
    )


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a pipeline without Airflow: decide, run the epoch's job, close, in a loop",
        description=(
            "Run your pipeline as the Airflow DAG would, on the runner its engine setting "
            "chooses (submit: each epoch's job a child process; warm: the warm engine, "
            "started here and stopped at the end): the settings "
            "file holds what the Airflow Variables hold (pipeline, source, warehouse, "
            "thresholds). Stops on Ctrl-C, or at --until / --for. Credentials come from the "
            "environment: MODESWITCH_KAFKA_CONFIG for a kafka:// source, "
            "MODESWITCH_STORAGE_OPTIONS for the tables."
        ),
    )
    p.add_argument("--config", required=True, help="a TOML or JSON file of settings")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument(
        "--until",
        choices=["caught-up"],
        help="caught-up: stop once a stream epoch has committed up to the latest offsets it "
        "saw when it started",
    )
    stop.add_argument("--for", dest="duration", help="stop after this long, e.g. 10m or PT1H")


def _run(args: argparse.Namespace) -> int:
    from modeswitch.control.settings_layers import layer_settings, read_settings_file
    from modeswitch.runners.lifecycle import run_pipeline

    settings = layer_settings((f"config file {args.config}:", read_settings_file(args.config)))
    duration = parse_duration(args.duration, setting="--for") if args.duration else None
    stop = StopFlag()

    def report(plan, status, end) -> None:
        console.print(
            f"epoch {plan.epoch}: {plan.mode} ({plan.reason}) -> {status} at "
            f"{sum(end.values()):,} records committed"
        )

    console.print(f"pipeline {settings.pipeline}: source {settings.source}, sink {settings.sink}")
    run_pipeline(settings, until=args.until, duration=duration, should_stop=stop, on_epoch=report)
    return 0


def _add_backfill(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "backfill",
        help="load (fill) or re-derive (reprocess) one event-time window, beside the pipeline",
        description=(
            "One backfill run without Airflow, as one run of the modeswitch_backfill DAG: "
            "the window's records (by event time, late ones included) are read, transformed "
            "and replaced in the sink in one commit per table, while the pipeline runs. fill: "
            "the records below where the live pipeline started; reprocess: those the sink "
            "holds. Refused, before anything is written, for a window that ends in the "
            "future, lies beyond retention, or overlaps a running backfill."
        ),
    )
    p.add_argument("--config", required=True, help="the pipeline's settings file")
    p.add_argument("--start", required=True, help="window start, ISO-8601 (UTC if no offset)")
    p.add_argument("--end", required=True, help="window end (exclusive), ISO-8601")
    p.add_argument("--mode", choices=["fill", "reprocess"], default="fill")
    p.add_argument("--buckets", help="comma-separated buckets (default: all)")


def _backfill(args: argparse.Namespace) -> int:
    import uuid

    from modeswitch.control.settings_layers import layer_settings, read_settings_file
    from modeswitch.modes.backfill import Window, end_unfinished_backfill, plan_backfill
    from modeswitch.runners.local import run_job_process
    from modeswitch.state import StateStore

    settings = layer_settings((f"config file {args.config}:", read_settings_file(args.config)))
    try:
        buckets = [int(b) for b in args.buckets.split(",")] if args.buckets else None
    except ValueError as exc:
        raise ModeswitchError(f"--buckets {args.buckets!r}: not a list of numbers") from exc
    run_id = f"cli-{uuid.uuid4().hex[:12]}"
    plan = plan_backfill(
        settings,
        Window.parse(args.start, args.end),
        args.mode,
        run_id=run_id,
        issuer=f"modeswitch backfill {run_id}",
        buckets=buckets,
    )
    console.print(
        f"backfill {plan.mode} {plan.window} of {settings.pipeline}: command {plan.command}, "
        f"up to {plan.records_bound:,} records in {len(plan.ranges)} buckets"
    )
    store = StateStore.from_settings(settings)
    try:
        run_job_process("backfill", settings, plan.command, timeout=3 * 3600)
    finally:
        done = end_unfinished_backfill(store, plan.command)
    console.print(
        f"command {done.id} {done.status}: {done.args.get('records', 0):,} records, "
        f"{done.args.get('quarantined', 0):,} quarantined, sink version "
        f"{done.args.get('sink_version')}"
    )
    return 0


def _add_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="what a pipeline is doing and why: mode, lag against thresholds, decisions",
        description=(
            "Show a pipeline's mode and why, the next decision's inputs evaluated now, each "
            "bucket's offsets and lags, and the newest epochs, decisions and commands, from "
            "its control tables. Nothing is written. Give the settings file of `modeswitch "
            "run`, or --pipeline and --warehouse (and --source for the lags)."
        ),
    )
    p.add_argument("--config", help="a TOML or JSON file of pipeline settings")
    p.add_argument("--pipeline", help="the pipeline's name (overrides the file's)")
    p.add_argument("--warehouse", help="where its tables live (overrides the file's)")
    p.add_argument("--source", help="its source log or kafka://<topic> (overrides the file's)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument(
        "--watch",
        nargs="?",
        const="5s",
        metavar="EVERY",
        help="refresh every EVERY (default 5s) until Ctrl-C",
    )
    p.add_argument("--rows", type=int, default=20, help="epochs, decisions, commands shown")
    p.add_argument(
        "--buckets",
        type=int,
        default=50,
        help="past this many buckets, show the worst-lagging ones and a summary (0: all)",
    )


def _status(args: argparse.Namespace) -> int:
    import json

    from rich.live import Live

    from modeswitch.control.settings_layers import (
        layer_settings,
        read_settings_file,
        setting_origins,
    )
    from modeswitch.ops.status import pipeline_status
    from modeswitch.ops.status_view import render_status

    given = {
        name: getattr(args, name)
        for name in ("pipeline", "warehouse", "source")
        if getattr(args, name) is not None
    }
    if args.config is None and "pipeline" not in given:
        raise ModeswitchError("status: give --config FILE, or --pipeline (and --warehouse)")
    if args.rows < 1:
        raise ModeswitchError(f"status: --rows {args.rows} must be at least 1")
    if args.buckets < 0:
        raise ModeswitchError(f"status: --buckets {args.buckets} must be 0 (all) or more")
    layers = [
        (f"config file {args.config}:", read_settings_file(args.config) if args.config else None),
        ("command line:", given),
    ]
    settings = layer_settings(*layers)
    origins = setting_origins(*layers)

    def status() -> dict:
        return pipeline_status(settings, origins=origins, rows=args.rows)

    if args.watch is None:
        if args.json:
            print(json.dumps(status(), indent=1))
        else:
            console.print(render_status(status(), buckets=args.buckets))
        return 0
    every = parse_duration(args.watch, setting="--watch").total_seconds()
    stop = StopFlag()
    if args.json:
        while True:
            print(json.dumps(status()), flush=True)
            if stop.wait(every):
                return 0
    with Live(
        render_status(status(), buckets=args.buckets), console=console, auto_refresh=False
    ) as live:
        while not stop.wait(every):
            live.update(render_status(status(), buckets=args.buckets), refresh=True)
    return 0


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="audit that every committed record is in the sink or quarantine exactly once",
        description=(
            "Compare the sink and quarantine tables with the source log up to the pipeline's "
            "committed offsets: per bucket, records missing, duplicated and out of range. "
            "Exits 0 when exact, 1 on any discrepancy, 2 on an error."
        ),
    )
    p.add_argument("--log", required=True, help="the source log's root folder or URI")
    p.add_argument("--sink", required=True, help="the sink Delta table's URI")
    p.add_argument("--quarantine", required=True, help="the quarantine Delta table's URI")
    p.add_argument("--pipeline", required=True, help="the pipeline id (its app transaction)")
    p.add_argument(
        "--spot-check",
        type=int,
        default=0,
        metavar="N",
        help="also compare up to N quarantined records' key and value with the source",
    )
    p.add_argument(
        "--state",
        metavar="ROOT",
        help="the pipeline's control tables (default: <sink's folder>/_modeswitch/<pipeline>): "
        "the summaries maintenance kept of the sink's log before cleaning it",
    )


def _verify(args: argparse.Namespace) -> int:
    from rich import box

    from modeswitch.ops.verify import audit

    if args.spot_check < 0:
        raise ModeswitchError(f"verify: --spot-check {args.spot_check} is negative")
    from modeswitch.state import StateStore
    from modeswitch.storage import storage_options

    options = storage_options()  # MODESWITCH_STORAGE_OPTIONS, if set
    state_root = (
        args.state or f"{args.sink.rstrip('/').rsplit('/', 1)[0]}/_modeswitch/{args.pipeline}"
    )
    store = StateStore(state_root, args.sink, args.pipeline, storage_options=options)
    report = audit(
        args.log,
        args.sink,
        args.quarantine,
        args.pipeline,
        spot_check=args.spot_check,
        storage_options=options,
        summaries=store.log_summaries(),
    )
    table = Table(title=f"exactly-once audit of pipeline {report.pipeline!r}", box=box.SIMPLE_HEAD)
    for name in ("bucket", "expected", "sink", "quarantine", "missing", "duplicated"):
        # Full header words; in 80 columns "out of range" wraps instead.
        table.add_column(name, justify="right", min_width=len(name))
    table.add_column("out of range", justify="right")
    for row in report.buckets:
        table.add_row(
            str(row.bucket),
            f"{row.expected:,}" if row.committed is not None else "-",
            f"{row.in_sink:,}",
            f"{row.in_quarantine:,}",
            f"{row.missing:,}",
            f"{row.duplicated:,}",
            f"{row.out_of_range:,}",
            style=None if row.ok else "red",
        )
    totals = report.totals
    table.add_section()
    table.add_row(
        "total",
        f"{totals.expected:,}",
        f"{totals.in_sink:,}",
        f"{totals.in_quarantine:,}",
        f"{totals.missing:,}",
        f"{totals.duplicated:,}",
        f"{totals.out_of_range:,}",
        style="bold",
    )
    console.print(table)
    console.print(
        f"sink {report.sink_uri} at version {report.sink_version}, "
        f"{report.sink_commits} commits; quarantine {report.quarantine_uri} at version "
        f"{report.quarantine_version}; {report.seconds:.2f} s"
    )
    for row in report.buckets:
        if row.ok:
            continue
        found = []
        if row.missing:
            ranges = ", ".join(f"[{a}, {b})" for a, b in row.missing_ranges)
            found.append(f"missing {ranges}")
        if row.duplicated:
            found.append(f"duplicated {', '.join(map(str, row.duplicated_offsets))}")
        if row.out_of_range:
            found.append(f"out of range {', '.join(map(str, row.out_of_range_offsets))}")
        where = (
            f"range [{row.start}, {row.committed})"
            if row.committed is not None
            else "nothing committed"
        )
        console.print(f"bucket {row.bucket} ({where}): {'; '.join(found)} (first offsets)")
    for erasure in report.erasures:
        console.print(
            f"{erasure.describe()}, another writer's commit, removed {erasure.records:,} "
            "records: counted as erased, not missing"
        )
    if totals.erased:
        console.print(f"{totals.erased:,} committed records are absent because they were erased")
    for problem in report.problems:
        console.print(f"[red]{problem}[/red]")
    if report.spot_check is not None:
        check = report.spot_check
        console.print(
            f"spot check: {check.checked} quarantined records compared with the source, "
            f"{check.skipped} no longer in the source, {len(check.mismatches)} mismatches"
        )
        for m in check.mismatches:
            console.print(
                f"[red]bucket {m.bucket} offset {m.offset}: quarantined {m.column} "
                f"{m.quarantined!r} differs from the source's {m.source!r}[/red]"
            )
    if report.ok:
        console.print(
            "[green]OK[/green]: every committed record is in the sink or the "
            "quarantine exactly once"
            + (", or was erased by another writer" if totals.erased else "")
        )
        return 0
    mismatches = len(report.spot_check.mismatches) if report.spot_check else 0
    console.print(
        f"[red]FAILED[/red]: {totals.missing:,} missing, {totals.duplicated:,} duplicated, "
        f"{totals.out_of_range:,} out of range, {len(report.problems)} other problems, "
        f"{mismatches} spot-check mismatches"
    )
    return 1


def _add_maintain(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "maintain",
        help="compact, checkpoint, clean and vacuum the pipeline's tables, beside the pipeline",
        description=(
            "One maintenance run, as one run of the modeswitch_maintenance DAG: the sink's and "
            "quarantine's small files compacted, their logs checkpointed and cleaned, old "
            "files vacuumed; progress merged past progress_horizon; the control tables "
            "rewritten; old stream checkpoints deleted. Safe while the pipeline runs. "
            "Refused while another run holds the pipeline's maintenance lease."
        ),
    )
    p.add_argument("--config", required=True, help="the pipeline's settings file")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _maintain(args: argparse.Namespace) -> int:
    import json

    from rich import box

    from modeswitch.control.settings_layers import layer_settings, read_settings_file
    from modeswitch.ops.maintenance import maintain

    settings = layer_settings((f"config file {args.config}:", read_settings_file(args.config)))
    report = maintain(settings, issuer="modeswitch maintain")
    if args.json:
        console.print_json(json.dumps(report.to_dict()))
        return 0
    table = Table(title=f"maintenance of pipeline {report.pipeline!r}", box=box.SIMPLE_HEAD)
    for name in ("table", "files", "log KiB", "vacuumed", "seconds"):
        table.add_column(name, justify="left" if name == "table" else "right")
    for done in report.tables:
        table.add_row(
            done.table,
            f"{done.files_before:,} -> {done.files_after:,}",
            f"{done.log_bytes_before // 1024:,} -> {done.log_bytes_after // 1024:,}",
            f"{done.vacuumed:,}",
            f"{done.seconds:.2f}",
        )
    console.print(table)
    console.print(
        f"command {report.command}: {report.progress_merged:,} progress rows merged, "
        f"{len(report.checkpoints_removed)} stream checkpoint folders deleted, the sink's log "
        f"summarised to version {report.summarised_through}; {report.seconds:.2f} s"
    )
    return 0


def _add_engine(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "engine",
        help="the pipeline's warm engine: whether it runs, what it runs; stop it",
        description=(
            "The warm engine (setting engine = warm) outlives the Airflow tasks that start it. "
            "'status' says whether it runs and which epoch; 'stop' stops it by its process "
            "group (its running epoch is resumed by the next task, as after a crash)."
        ),
    )
    p.add_argument("action", choices=("status", "stop"))
    p.add_argument("--config", required=True, help="the pipeline's settings file")


def _engine(args: argparse.Namespace) -> int:
    from modeswitch.control.settings_layers import layer_settings, read_settings_file
    from modeswitch.runners.engine import engine_file, live_engine, ping, stop_engine

    settings = layer_settings((f"config file {args.config}:", read_settings_file(args.config)))
    if args.action == "stop":
        stopped = stop_engine(settings)
        console.print("stopped the engine" if stopped else "no engine runs")
        return 0
    address = live_engine(settings)
    if address is None:
        console.print(f"no engine runs for pipeline {settings.pipeline!r}")
        return 1
    running = ping(address).get("running")
    what = f"running {running[0]} epoch {running[1]}" if running else "idle"
    console.print(
        f"engine pid {address.pid} on {address.host}:{address.port}: {what} "
        f"(address file {engine_file(settings)})"
    )
    return 0


def _add_jars(sub: argparse._SubParsersAction) -> None:
    sub.add_parser(
        "jars",
        help="print the jars every Spark session of ours adds to Spark's (spark.jars)",
        description=(
            "The jars `make install` fetched from jvm/pom.xml (delta-spark and what it needs "
            "that pyspark lacks), as one comma-separated line of absolute paths: "
            'spark-submit --jars "$(modeswitch jars)" ...'
        ),
    )


def _jars(args: argparse.Namespace) -> int:
    from modeswitch.runners.jvm import fetched_jars

    # One plain line, never wrapped: the console would break it at the terminal's width.
    print(",".join(fetched_jars()))
    return 0


def _add_settings(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "settings",
        help="print every setting as a markdown table: name, Airflow Variable, type, default",
        description=(
            "The settings table, made from the settings classes' fields "
            "(modeswitch.control.settings): each setting's name, its Airflow Variable, its "
            "type, its default and what it does. With --update FILE, the table between FILE's "
            "settings-table markers is replaced instead (docs/AIRFLOW.md holds one)."
        ),
    )
    p.add_argument("--update", metavar="FILE", help="rewrite FILE's table instead of printing")


def _settings(args: argparse.Namespace) -> int:
    from pathlib import Path

    from modeswitch.control.settings_table import settings_table, with_settings_table

    if args.update is None:
        # Plain markdown, never wrapped or styled: the console would break its long rows.
        sys.stdout.write(settings_table())
        return 0
    path = Path(args.update)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModeswitchError(f"settings --update {path}: cannot read it ({exc})") from exc
    updated = with_settings_table(text)
    if updated != text:
        path.write_text(updated)
    console.print(f"{path}: settings table {'updated' if updated != text else 'up to date'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modeswitch", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_produce,
        _add_offsets,
        _add_retain,
        _add_demo,
        _add_run,
        _add_backfill,
        _add_maintain,
        _add_engine,
        _add_jars,
        _add_status,
        _add_verify,
        _add_settings,
    ):
        add(sub)
    return parser


COMMANDS = {
    "produce": _produce,
    "offsets": _offsets,
    "retain": _retain,
    "demo": _demo,
    "run": _run,
    "backfill": _backfill,
    "maintain": _maintain,
    "engine": _engine,
    "jars": _jars,
    "status": _status,
    "verify": _verify,
    "settings": _settings,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return COMMANDS[args.command](args)
    except (ModeswitchError, ValueError) as exc:
        errors.print(f"[red]error:[/red] {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["build_parser", "main"]
