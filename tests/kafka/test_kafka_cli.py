"""The command line on a Kafka topic: produce synthetic events, read offsets, run a pipeline
from a settings file, audit it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

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
    args = ["produce", "--kafka", kafka_cluster.bootstrap, "--topic", topic, "--records", "20000"]
    assert main([*args, "--skew", "zipf:0.5", "--malformed-fraction", "0.01"]) == 0
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
    assert main(["run", "--config", str(config), "--until", "caught-up"]) == 0
    out = capsys.readouterr().out
    assert "batch" in out and "stream" in out and "completed at 20,000" in out
    sink, quarantine = tmp_path / "warehouse" / "cli", tmp_path / "warehouse" / "cli_quarantine"
    audit = ["verify", "--log", source, "--sink", str(sink), "--quarantine", str(quarantine)]
    assert main([*audit, "--pipeline", "cli"]) == 0


def test_bad_produce_arguments_are_refused(kafka_cluster: KafkaBroker, capsys) -> None:
    assert main(["produce", "--kafka", kafka_cluster.bootstrap, "--records", "10"]) == 2
    assert "--kafka needs --topic" in capsys.readouterr().err
    args = ["produce", "--kafka", kafka_cluster.bootstrap, "--topic", "t", "--buckets", "3"]
    assert main([*args, "--records", "10"]) == 2
    assert "--buckets creates an embedded log" in capsys.readouterr().err
