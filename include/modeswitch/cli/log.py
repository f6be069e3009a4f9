"""The ``modeswitch`` commands that work on a log itself: ``produce`` (synthetic events, at a
rate, with a progress bar), ``offsets`` and ``retain``. :mod:`modeswitch.cli` assembles the
parser from each command group's ``add_<command>`` and runs the command's function."""

from __future__ import annotations

import argparse

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from modeswitch.cli.terminal import StopFlag, console, errors
from modeswitch.control.settings import parse_duration, parse_rate
from modeswitch.errors import ModeswitchError
from modeswitch.offsets import offsets_from_json


def add_produce(sub: argparse._SubParsersAction) -> None:
    """Add the ``produce`` command's parser to ``sub``."""
    p = sub.add_parser(
        "produce",
        help="append synthetic events to the embedded log",
        description=(
            "Append synthetic events with a JSON payload to an embedded bucketed log. Without "
            "--rate, --records events are written as fast as possible (a backlog). With --rate, "
            "events are written live until --duration has passed or --records were written."
        ),
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--log", help="the embedded log's root folder or URI")
    where.add_argument(
        "--kafka",
        metavar="BOOTSTRAP",
        help="produce to Kafka at these bootstrap servers (other client settings, such as "
        "credentials, from MODESWITCH_KAFKA_CONFIG); needs --topic",
    )
    p.add_argument("--topic", help="the Kafka topic (it must exist: partitions are buckets)")
    p.add_argument("--buckets", type=int, help="bucket count (required to create a new log)")
    p.add_argument("--records", type=int, help="how many events to write")
    p.add_argument("--skew", default="uniform", help="'uniform' or 'zipf:S' (bucket 0 heaviest)")
    p.add_argument("--rate", help="live rate, e.g. 5000/s; omit for a backlog")
    p.add_argument("--duration", help="how long a live run lasts, e.g. 60s or PT5M")
    p.add_argument("--span", default="0s", help="backlog event times spread over this, to now")
    p.add_argument("--late-fraction", type=float, default=0.0, help="share of late events")
    p.add_argument("--max-lateness", default="10m", help="how late a late event can be")
    p.add_argument("--malformed-fraction", type=float, default=0.0, help="share of bad JSON")
    p.add_argument("--seed", type=int, default=0, help="same seed, same events")
    p.add_argument("--segment-records", type=int, default=100_000, help="backlog segment size")
    p.add_argument("--flush", default="100ms", help="live flush interval")


def produce_command(args: argparse.Namespace) -> int:
    """``modeswitch produce``: append synthetic events to an embedded log or a Kafka topic, as a
    backlog or live."""
    from modeswitch.devtools.produce import EventGenerator, produce_backlog, produce_live

    rate = parse_rate(args.rate, setting="--rate") if args.rate else None
    duration = parse_duration(args.duration, setting="--duration") if args.duration else None
    if rate is None and args.records is None:
        raise ModeswitchError("produce: give --records for a backlog, or --rate for a live run")
    if rate is None and duration is not None:
        raise ModeswitchError("produce: --duration needs --rate (a backlog stops at --records)")
    if args.records is not None and args.records < 0:
        raise ModeswitchError(f"produce: --records {args.records} is negative")
    log_ = _producer_log(args)
    generator = EventGenerator(
        seed=args.seed,
        buckets=len(log_.buckets()),
        skew=args.skew,
        late_fraction=args.late_fraction,
        malformed_fraction=args.malformed_fraction,
        max_lateness=parse_duration(args.max_lateness, setting="--max-lateness"),
    )
    # Continue the event numbering of what the log already holds.
    first = sum(log_.latest_offsets().values())
    total = args.records
    if total is None and rate is not None and duration is not None:
        total = int(rate * duration.total_seconds())
    stop = StopFlag()
    with _progress(total) as (progress, task):

        def advance(n: int) -> None:
            progress.advance(task, n)

        if rate is None:
            report = produce_backlog(
                log_,
                generator,
                records=args.records,
                first=first,
                span=parse_duration(args.span, setting="--span"),
                segment_records=args.segment_records,
                on_progress=advance,
            )
        else:
            report = produce_live(
                log_,
                generator,
                rate=rate,
                duration=duration,
                records=args.records,
                first=first,
                flush_every=parse_duration(args.flush, setting="--flush"),
                should_stop=stop,
                on_progress=advance,
            )
    latest = log_.latest_offsets()
    table = Table(title=f"produced into {args.log or log_}")
    table.add_column("bucket", justify="right")
    table.add_column("appended", justify="right")
    table.add_column("latest offset", justify="right")
    for bucket in log_.buckets():
        table.add_row(str(bucket), f"{report.per_bucket.get(bucket, 0):,}", f"{latest[bucket]:,}")
    table.add_row("total", f"{report.records:,}", f"{sum(latest.values()):,}")
    console.print(table)
    per_second = report.records / report.seconds if report.seconds else 0.0
    console.print(f"{report.records:,} records in {report.seconds:.1f} s ({per_second:,.0f}/s)")
    return 0


class _progress:
    def __init__(self, total: int | None) -> None:
        self.progress = Progress(
            TextColumn("producing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=errors,
            disable=not errors.is_terminal,
            transient=True,
        )
        self.total = total

    def __enter__(self) -> tuple[Progress, int]:
        self.progress.start()
        return self.progress, self.progress.add_task("produce", total=self.total)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _producer_log(args: argparse.Namespace):
    """The log ``produce`` writes to: a Kafka topic (``--kafka``, ``--topic``) or the embedded
    log (``--log``, created with ``--buckets``)."""
    if args.kafka is None:
        if args.topic is not None:
            raise ModeswitchError("produce: --topic goes with --kafka, not --log")
        return _open_or_create(args.log, args.buckets)
    from modeswitch.sources.kafka import SCHEME, KafkaLog, kafka_config

    if not args.topic:
        raise ModeswitchError("produce: --kafka needs --topic")
    if args.buckets is not None:
        raise ModeswitchError(
            "produce: --buckets creates an embedded log; a Kafka topic's partitions are its "
            "buckets (create the topic with them)"
        )
    return KafkaLog(f"{SCHEME}{args.topic}", {**kafka_config(), "bootstrap.servers": args.kafka})


def _open_or_create(root: str, buckets: int | None):
    from modeswitch.sources.segments import SegmentLog

    if buckets is not None:
        return SegmentLog.create(root, buckets=buckets)
    return SegmentLog(root)


def add_offsets(sub: argparse._SubParsersAction) -> None:
    """Add the ``offsets`` command's parser to ``sub``."""
    p = sub.add_parser("offsets", help="show a log's earliest and latest offsets per bucket")
    p.add_argument("--log", required=True)


def offsets_command(args: argparse.Namespace) -> int:
    """``modeswitch offsets``: print a log's earliest and latest offsets per bucket."""
    from modeswitch.sources import open_log

    log_ = open_log(args.log)
    earliest, latest = log_.earliest_offsets(), log_.latest_offsets()
    table = Table(title=f"offsets of {args.log}")
    for name in ("bucket", "earliest", "latest", "records"):
        table.add_column(name, justify="right")
    for bucket in log_.buckets():
        table.add_row(
            str(bucket),
            f"{earliest[bucket]:,}",
            f"{latest[bucket]:,}",
            f"{latest[bucket] - earliest[bucket]:,}",
        )
    console.print(table)
    return 0


def add_retain(sub: argparse._SubParsersAction) -> None:
    """Add the ``retain`` command's parser to ``sub``."""
    p = sub.add_parser("retain", help="drop whole segments below per-bucket offsets")
    p.add_argument("--log", required=True)
    p.add_argument("--before", required=True, help='offsets map as JSON, e.g. {"0": 1000}')


def retain_command(args: argparse.Namespace) -> int:
    """``modeswitch retain``: drop a log's whole segments below per-bucket offsets."""
    from modeswitch.sources.segments import SegmentLog

    log_ = SegmentLog(args.log)
    before = offsets_from_json(args.before, source="--before")
    dropped = log_.drop_before(before)
    console.print(f"dropped {dropped} segments; earliest offsets now {log_.earliest_offsets()}")
    return 0
