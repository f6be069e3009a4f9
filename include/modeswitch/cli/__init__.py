"""The ``modeswitch`` command line: produce synthetic events, inspect a log, run the demo or a
pipeline, show a pipeline's status, audit it."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence

from modeswitch.cli import demo, deploy, inspection, log, pipeline
from modeswitch.cli.terminal import errors
from modeswitch.errors import ModeswitchError

# The subcommands in the order --help lists them: each one's parser and what it runs.
SUBCOMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable]] = {
    "produce": (log.add_produce, log.produce_command),
    "offsets": (log.add_offsets, log.offsets_command),
    "retain": (log.add_retain, log.retain_command),
    "demo": (demo.add_demo, demo.demo_command),
    "run": (pipeline.add_run, pipeline.run_command),
    "backfill": (pipeline.add_backfill, pipeline.backfill_command),
    "maintain": (pipeline.add_maintain, pipeline.maintain_command),
    "engine": (pipeline.add_engine, pipeline.engine_command),
    "jars": (deploy.add_jars, deploy.jars_command),
    "status": (inspection.add_status, inspection.status_command),
    "verify": (inspection.add_verify, inspection.verify_command),
    "settings": (deploy.add_settings, deploy.settings_command),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modeswitch", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for add, _ in SUBCOMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    _, command = SUBCOMMANDS[args.command]
    try:
        return command(args)
    except (ModeswitchError, ValueError) as exc:
        errors.print(f"[red]error:[/red] {exc}")
        return 2


__all__ = ["build_parser", "main"]
