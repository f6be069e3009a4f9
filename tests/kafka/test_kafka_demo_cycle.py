"""The demo's whole cycle on a Kafka topic (batch, stream, a burst, batch, stream), with
transactions, a third of them aborted, in the topic.

In a file of its own because it runs alone (``exclusive``: its thresholds are wall-clock
lags), and a file is what two test workers take at a time: ``tests/conftest.py`` starts it
beside the unit files, which take no lock. Real parts as in ``test_kafka_pipeline.py``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_tools import scaled_to_this_hour
from rich.console import Console

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.demo import DEMO_SETTINGS, demo_cycle, demo_sources
from modeswitch.ops.verify import audit
from modeswitch.sources import open_log
from modeswitch.sources.kafka import KafkaLocation
from modeswitch.state import StateStore

PARTITIONS = 8


def _gaps(source: str) -> int:
    log = open_log(source)
    latest = log.latest_offsets()
    return sum(latest[b] - len(log.held_offsets(b, 0, latest[b])) for b in latest)


@pytest.mark.exclusive  # its timing is part of what it proves (tests/conftest.py)
def test_the_demo_cycle_on_kafka_is_exactly_once(
    new_topic: Callable[[int], str], transactions, kafka_secret: str, tmp_path: Path
) -> None:
    source = new_topic(PARTITIONS)
    settings = PipelineSettings.from_mapping(
        {
            **DEMO_SETTINGS,
            "pipeline": "kafka_e2e",
            "source": source,
            "warehouse": str(tmp_path / "warehouse"),
            # Half the demo's thresholds: each batch here leaves a lag of ~9-12 s (6 s for
            # the 500 000 records, then the stream's start), and the stream after the burst
            # crosses 30 s half a minute sooner than 60 s.
            "watermark_lag_threshold": "30s",
            "enter_threshold": "30s",
            "exit_threshold": "25s",
        }
    )
    console = Console(file=(tmp_path / "cycle.txt").open("w"), width=120)
    # 500 000 records with skew (zipf 0.5 puts 23 % in partition 0; sized when the tier ran on
    # librdkafka's mock cluster, which kept ~200 000 a partition), then transactions, a third
    # aborted: they and their markers leave gaps.
    with demo_sources(
        settings, records=500_000, buckets=PARTITIONS, console=console, skew="zipf:0.5"
    ) as log:
        transactions(
            KafkaLocation.parse(source).topic,
            partitions=PARTITIONS,
            transactions=60,
            base_ms=int(time.time() * 1000) - 15 * 60_000,  # in the past: no future event times
        )
        demo_cycle(
            settings, log, PARTITIONS, console, burst_after=10, after_backlog=scaled_to_this_hour
        )
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)
    epochs = store.epochs.list()
    assert [e.mode for e in epochs][:4] == ["batch", "stream", "batch", "stream"]
    for before, after in itertools.pairwise(epochs):
        assert after.start == before.end  # every handoff exact, at Kafka offsets
    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.ok, report
    assert report.totals.missing == report.totals.duplicated == report.totals.out_of_range == 0
    committed = sum(epochs[-1].end.values())
    assert report.totals.expected < committed  # the gaps are not counted as records
    assert report.totals.expected >= 500_000
    assert _gaps(source) >= 60
    # The client configuration's secret is in no file the pipeline wrote: job logs, Spark's
    # checkpoints, the sink's and the control tables' logs and files.
    holding = [
        str(path)
        for path in tmp_path.rglob("*")
        if path.is_file() and kafka_secret.encode() in path.read_bytes()
    ]
    assert holding == []
    assert any(tmp_path.rglob("*.log")), "the jobs' logs are among the files checked"
