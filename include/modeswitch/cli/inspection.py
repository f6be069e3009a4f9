"""The ``modeswitch`` commands that look at a pipeline and write nothing: ``status`` (what it
is doing and why, once or refreshed) and ``verify`` (the exactly-once audit of its sink and
quarantine against the source)."""

from __future__ import annotations

import argparse

from rich.table import Table

from modeswitch.cli.terminal import StopFlag, console
from modeswitch.control.settings import parse_duration
from modeswitch.environment import PIPELINES_DIR, env_value
from modeswitch.errors import ModeswitchError


def add_status(sub: argparse._SubParsersAction) -> None:
    """Add the ``status`` command's parser to ``sub``."""
    p = sub.add_parser(
        "status",
        help="what a pipeline is doing and why: mode, lag against thresholds, decisions",
        description=(
            "Show a pipeline's mode and why, the next decision's inputs evaluated now, each "
            "bucket's offsets and lags, and the newest epochs, decisions and commands, from "
            "its control tables. Nothing is written. Give the settings file of `modeswitch "
            "run`, or --pipeline and --warehouse (and --source for the lags). Without either: "
            "one row per pipeline of the pipelines folder (--pipelines, or "
            f"${PIPELINES_DIR.name}), and the Airflow Variables under modeswitch_ that tune "
            "nothing when Airflow is configured here."
        ),
    )
    p.add_argument(
        "--pipelines",
        help="the pipelines folder (one settings file per pipeline) for the overview of all",
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


def status_command(args: argparse.Namespace) -> int:
    """``modeswitch status``: print a pipeline's status, once or every ``--watch`` interval until
    Ctrl-C."""
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
        return _overview_command(args)
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


def _overview_command(args: argparse.Namespace) -> int:
    """``modeswitch status`` without a pipeline: a row per pipeline of the pipelines folder."""
    import json

    from modeswitch.control.pipelines import list_fleet
    from modeswitch.ops.overview import fleet_overview, overview_table
    from modeswitch.ops.status import pipeline_status

    folder = args.pipelines or env_value(PIPELINES_DIR)
    if folder is None:
        raise ModeswitchError(
            "status: give --config FILE, --pipeline (and --warehouse), or the pipelines folder "
            f"(--pipelines DIR or ${PIPELINES_DIR.name}) for all of them"
        )
    fleet = list_fleet(folder)
    declared = [p for p in fleet.pipelines if p.declared]
    if not declared and not fleet.refused:
        raise ModeswitchError(f"status: {folder} holds no pipeline's settings file")

    def reader(pipeline):
        return lambda: pipeline_status(
            pipeline.own_settings(),
            rows=args.rows,
        )

    rows = fleet_overview((p.name, reader(p)) for p in declared)
    unknown, unchecked = _unknown_variables(fleet)
    if args.json:
        print(
            json.dumps({"pipelines": rows, "refused": fleet.refused, "unknown_variables": unknown})
        )
        return 0
    cells = overview_table(rows)
    table = Table(*cells[0], title=f"pipelines of {folder}")
    for line in cells[1:]:
        table.add_row(*line)
    console.print(table)
    for file, why in sorted(fleet.refused.items()):
        console.print(f"[red]refused[/red] {file}: {why}")
    for entry in unknown:
        console.print(f"[yellow]Airflow Variable {entry['key']!r}[/yellow] {entry['problem']}")
    if unchecked:
        console.print(f"[dim]Airflow Variables not checked: {unchecked}[/dim]")
    return 0


def _unknown_variables(fleet) -> tuple[list[dict[str, str]], str | None]:
    """The Variables under modeswitch_ that tune nothing (where Airflow is configured here:
    ``AIRFLOW_HOME`` set), or why they were not checked."""
    import os

    if not os.environ.get("AIRFLOW_HOME"):
        return [], "no AIRFLOW_HOME here"
    try:
        from modeswitch.airflow.settings import unknown_variables

        found = unknown_variables(fleet)
    except Exception as exc:  # no metadata database here: the overview stands without
        return [], f"{type(exc).__name__}: {exc}"
    return [{"key": t.key, "problem": t.problem} for t in found], None


def add_verify(sub: argparse._SubParsersAction) -> None:
    """Add the ``verify`` command's parser to ``sub``."""
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


def verify_command(args: argparse.Namespace) -> int:
    """``modeswitch verify``: print the exactly-once audit; 0 when exact, 1 on any discrepancy."""
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
        summaries=store.commands.log_summaries(),
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
