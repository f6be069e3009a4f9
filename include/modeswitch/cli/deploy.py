"""The ``modeswitch`` commands that print what a deployment needs: ``jars`` (the jars every
Spark session of ours adds, for ``spark-submit --jars``) and ``settings`` (the settings table,
or a file's copy of it brought up to date)."""

from __future__ import annotations

import argparse
import sys

from modeswitch.cli.terminal import console
from modeswitch.errors import ModeswitchError


def add_jars(sub: argparse._SubParsersAction) -> None:
    """Add the ``jars`` command's parser to ``sub``."""
    sub.add_parser(
        "jars",
        help="print the jars every Spark session of ours adds to Spark's (spark.jars)",
        description=(
            "The jars `make install` fetched from jvm/pom.xml (delta-spark and what it needs "
            "that pyspark lacks), as one comma-separated line of absolute paths: "
            'spark-submit --jars "$(modeswitch jars)" ...'
        ),
    )


def jars_command(args: argparse.Namespace) -> int:
    """``modeswitch jars``: print the jars of ``spark.jars`` on one line, comma-separated."""
    from modeswitch.runners.jvm import fetched_jars

    # One plain line, never wrapped: the console would break it at the terminal's width.
    print(",".join(fetched_jars()))
    return 0


def add_settings(sub: argparse._SubParsersAction) -> None:
    """Add the ``settings`` command's parser to ``sub``."""
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


def settings_command(args: argparse.Namespace) -> int:
    """``modeswitch settings``: print the settings table, or bring a file's copy up to date."""
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
