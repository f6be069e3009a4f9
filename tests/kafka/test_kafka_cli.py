"""The command line on a Kafka topic: produce synthetic events, read offsets, run a pipeline
from a settings file, audit it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_tools import kill_processes_with_environment

from modeswitch.cli import main
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.sources import open_log
from modeswitch.sources.kafka import KafkaLocation


def test_produce_then_run_until_caught_up_then_verify(
    kafka_cluster: KafkaBroker,
    new_topic: Callable[[int], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = new_topic(4)
    topic = KafkaLocation.parse(source).topic
    args = ["produce", "--kafka", kafka_cluster.bootstrap, "--topic", topic, "--skew", "zipf:0.5"]
    assert main([*args, "--records", "20000", "--malformed-fraction", "0.01"]) == 0
    latest = open_log(source).latest_offsets()
    assert sum(latest.values()) == 20_000
    assert latest[0] > latest[3]  # skewed
    assert main(["offsets", "--log", source]) == 0
    assert "20,000" in capsys.readouterr().out

    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'pipeline = "cli"\nsource = "{source}"\nwarehouse = "{tmp_path / "warehouse"}"\n'
        'enter_threshold = "1h"\nexit_threshold = "1h"\nwatermark_lag_threshold = "1h"\n'
    )
    # As a script or a scheduler runs it: a process of its own, twice (the second after more
    # records came), each exiting with status 0. Every client and table reader must be closed
    # before the interpreter exits: a reader left to deltalake's filesystem handler once made
    # one exit in four abort (SIGABRT, "terminate called without an active exception").
    for run, produced in enumerate((20_000, 25_000)):
        if run:
            assert main([*args, "--records", "5000"]) == 0
        done = _run_command(["run", "--config", str(config), "--until", "caught-up"])
        assert done.returncode == 0, done.stderr[-3000:]
        assert "terminate called" not in done.stderr
        assert "stream" in done.stdout and f"completed at {produced:,}" in done.stdout
    capsys.readouterr()
    sink, quarantine = tmp_path / "warehouse" / "cli", tmp_path / "warehouse" / "cli_quarantine"
    audit = ["verify", "--log", source, "--sink", str(sink), "--quarantine", str(quarantine)]
    assert main([*audit, "--pipeline", "cli"]) == 0


MARKER = "MODESWITCH_TEST_COMMAND"
"""Set in the command's environment: its job processes inherit it."""


def _run_command(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``modeswitch ARGS`` in a process of its own (the broker's address in its environment);
    whatever it started is killed after, even if it overran: its job processes lead process
    groups of their own, so they are found by a marker in their environment."""
    marker = uuid.uuid4().hex
    try:
        return subprocess.run(
            [sys.executable, "-m", "modeswitch.cli", *args],
            env={**os.environ, MARKER: marker},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        kill_processes_with_environment(MARKER, marker)


def test_bad_produce_arguments_are_refused(kafka_cluster: KafkaBroker, capsys) -> None:
    assert main(["produce", "--kafka", kafka_cluster.bootstrap, "--records", "10"]) == 2
    assert "--kafka needs --topic" in capsys.readouterr().err
    args = ["produce", "--kafka", kafka_cluster.bootstrap, "--topic", "t", "--buckets", "3"]
    assert main([*args, "--records", "10"]) == 2
    assert "--buckets creates an embedded log" in capsys.readouterr().err
