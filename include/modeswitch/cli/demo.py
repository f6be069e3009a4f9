"""``modeswitch demo``: the pipeline end to end on the embedded default (or a Kafka topic of
a broker it starts), run by :mod:`modeswitch.devtools.demo`."""

from __future__ import annotations

import argparse

from modeswitch.cli.terminal import console


def add_demo(sub: argparse._SubParsersAction) -> None:
    """Add the ``demo`` command's parser to ``sub``."""
    p = sub.add_parser("demo", help="run the pipeline end to end on the embedded default")
    p.add_argument("--dir", default=".demo", help="where the demo's data lives")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--buckets", type=int, default=16)
    p.add_argument(
        "--kafka",
        action="store_true",
        help="read a Kafka topic (buckets = partitions) of a broker the demo starts and stops",
    )


def demo_command(args: argparse.Namespace) -> int:
    """``modeswitch demo``: run the demo (:func:`modeswitch.devtools.demo.run_demo`)."""
    from modeswitch.devtools.demo import run_demo

    return run_demo(
        args.dir, records=args.records, buckets=args.buckets, console=console, kafka=args.kafka
    )
