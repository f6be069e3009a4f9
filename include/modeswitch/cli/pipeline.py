"""The ``modeswitch`` commands that run a pipeline, or work beside it, without Airflow:
``run`` (decide, run the epoch's job, close, in a loop), ``backfill`` (one event-time window),
``maintain`` (compact, checkpoint, clean, vacuum) and ``engine`` (the warm engine's status, or
stop it)."""

from __future__ import annotations

import argparse

from rich.table import Table

from modeswitch.cli.terminal import StopFlag, console
from modeswitch.control.settings import parse_duration
from modeswitch.errors import ModeswitchError


def add_run(sub: argparse._SubParsersAction) -> None:
    """Add the ``run`` command's parser to ``sub``."""
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
            "MODESWITCH_SCHEMA_REGISTRY_CONFIG for Avro values framed by a schema registry, "
            "MODESWITCH_STORAGE_OPTIONS for the tables. Several pipelines (--config more than "
            "once, or --pipelines DIR: one settings file per pipeline) run together, on one "
            "warm engine that serves them all (a lane and a scheduler pool each)."
        ),
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--config", action="append", help="a TOML or JSON file of settings (once per pipeline)"
    )
    which.add_argument("--pipelines", help="a folder of settings files, one per pipeline")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument(
        "--until",
        choices=["caught-up"],
        help="caught-up: stop once a stream epoch has committed up to the latest offsets it "
        "saw when it started",
    )
    stop.add_argument("--for", dest="duration", help="stop after this long, e.g. 10m or PT1H")


def run_command(args: argparse.Namespace) -> int:
    """``modeswitch run``: run the pipeline of a settings file (or several at once) until
    Ctrl-C, ``--until`` or ``--for``."""
    from modeswitch.runners.pipeline_run import run_pipeline

    pipelines = _run_settings(args)
    duration = parse_duration(args.duration, setting="--for") if args.duration else None
    stop = StopFlag()
    for settings in pipelines:
        console.print(
            f"pipeline {settings.pipeline}: source {settings.source}, sink {settings.sink}"
        )
    if len(pipelines) > 1:
        return _run_several(pipelines, args, duration, stop)

    def report(plan, status, end) -> None:
        console.print(
            f"epoch {plan.epoch}: {plan.mode} ({plan.reason}) -> {status} at "
            f"{sum(end.values()):,} records committed"
        )

    run_pipeline(
        pipelines[0], until=args.until, duration=duration, should_stop=stop, on_epoch=report
    )
    return 0


def _run_settings(args: argparse.Namespace) -> list:
    """The settings of each ``--config`` file, or of each file of ``--pipelines`` (a pipeline
    named after its file, as a deployment's pipelines folder declares them)."""
    from modeswitch.control.pipelines import list_fleet
    from modeswitch.control.settings_layers import layer_settings, read_settings_file

    if args.config:
        return [layer_settings((f"config file {f}:", read_settings_file(f))) for f in args.config]
    fleet = list_fleet(args.pipelines)
    if fleet.refused:
        file, why = next(iter(sorted(fleet.refused.items())))
        raise ModeswitchError(f"--pipelines {args.pipelines}: {file}: {why}")
    declared = [p for p in fleet.pipelines if p.declared]
    if not declared:
        raise ModeswitchError(f"--pipelines {args.pipelines}: no settings file (.toml, .json)")
    return [p.own_settings() for p in declared]


def _run_several(pipelines: list, args: argparse.Namespace, duration, stop) -> int:
    """Several pipelines at once, on one warm engine that serves them all."""
    from modeswitch.environment import ENGINE_SHARING, env_default
    from modeswitch.runners.pipeline_run import run_pipelines

    env_default(ENGINE_SHARING, "deployment")  # one engine serves them all

    def report(pipeline, plan, status, end) -> None:
        console.print(
            f"{pipeline}: epoch {plan.epoch}: {plan.mode} ({plan.reason}) -> {status} at "
            f"{sum(end.values()):,} records committed"
        )

    run_pipelines(pipelines, until=args.until, duration=duration, should_stop=stop, on_epoch=report)
    return 0


def add_backfill(sub: argparse._SubParsersAction) -> None:
    """Add the ``backfill`` command's parser to ``sub``."""
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


def backfill_command(args: argparse.Namespace) -> int:
    """``modeswitch backfill``: one backfill run of an event-time window, and print its command's
    outcome."""
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


def add_maintain(sub: argparse._SubParsersAction) -> None:
    """Add the ``maintain`` command's parser to ``sub``."""
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


def maintain_command(args: argparse.Namespace) -> int:
    """``modeswitch maintain``: one maintenance run of the pipeline's tables, and print its
    report."""
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


def add_engine(sub: argparse._SubParsersAction) -> None:
    """Add the ``engine`` command's parser to ``sub``."""
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


def engine_command(args: argparse.Namespace) -> int:
    """``modeswitch engine``: print whether the pipeline's warm engine runs (1 when not), or stop
    it."""
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
    answer = ping(address)
    lanes = answer.get("lanes") or {}
    if answer.get("shared"):  # the epoch each pipeline it serves runs
        what = "shared; " + (
            ", ".join(f"{p}: {kind} epoch {epoch}" for p, (kind, epoch) in sorted(lanes.items()))
            or "idle"
        )
    else:
        running = answer.get("running")
        what = f"running {running[0]} epoch {running[1]}" if running else "idle"
    console.print(
        f"engine pid {address.pid} on {address.host}:{address.port}: {what} "
        f"(address file {engine_file(settings)})"
    )
    return 0
