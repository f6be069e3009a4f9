"""The broker SIGKILLed under the pipeline and started again on its data: mid-batch (the waves
read with Spark's Kafka source) and mid-stream (Spark's Kafka source). The jobs ride it out:
their Kafka clients reconnect to the broker on the same address, the stream's policy decides
on the last offsets it saw meanwhile (``source_outage_grace``), and both jobs end by
themselves with every record once in the sink.

A broker of this test's own (not the tier's: the others would see it go), with its address in
the environment the jobs inherit."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from fault_tools import HELD_IN_STREAM, assert_exactly_once, pause_when_caught_up

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.kafka_broker import KafkaBroker
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.errors import ModeswitchError
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.kafka import ENV_KAFKA_CONFIG, SCHEME, KafkaLog, kafka_environment
from modeswitch.storage import delta_dataset

PARTITIONS = 4


def _kill_and_restart_once(
    broker: KafkaBroker, settings: PipelineSettings, epoch: int, commits: int, out: list
) -> threading.Thread:
    """A thread that, once epoch ``epoch`` has ``commits`` sink commits, SIGKILLs the broker,
    leaves it down 3 s and starts it again on its data; what it did goes to ``out``."""

    def run() -> None:
        deadline = time.monotonic() + 300
        while sum(c.epoch == epoch for c in sink_commits(settings.sink, settings.pipeline)) < (
            commits
        ):
            if time.monotonic() > deadline:
                out.append("the epoch never reached its commits")
                return
            time.sleep(0.2)
        broker.kill()
        time.sleep(3)
        began = time.monotonic()
        broker.start()
        out.append(f"killed after {commits} commits, back in {time.monotonic() - began:.1f} s")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _topic_with_backlog(
    broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch, topic: str, *, seed: int, records: int
) -> str:
    """A topic of :data:`PARTITIONS` holding ``records`` of the demo's events, the broker's
    address in the environment the jobs inherit; returns its source setting."""
    broker.create_topic(topic, PARTITIONS)
    monkeypatch.setenv(ENV_KAFKA_CONFIG, kafka_environment(broker.config)[ENV_KAFKA_CONFIG])
    source = f"{SCHEME}{topic}"
    with contextlib.closing(KafkaLog(source, broker.config)) as log:
        produce_backlog(log, EventGenerator(seed=seed, buckets=PARTITIONS), records=records)
    return source


def test_a_broker_killed_mid_batch_and_mid_stream_and_restarted_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KafkaBroker(tmp_path / "broker") as broker:
        source = _topic_with_backlog(broker, monkeypatch, "faulted", seed=11, records=120_000)
        settings = PipelineSettings.from_mapping(
            {
                "pipeline": "broker_faults",
                "source": source,
                "warehouse": str(tmp_path / "warehouse"),
                "batch_reader": "native",  # Spark's Kafka source
                "wave_records": "20000",
                "max_split_records": "10000",
                "max_records_per_trigger": "5000",
                **HELD_IN_STREAM,
            }
        )
        done: list[str] = []
        batch = decide(settings)
        assert batch.mode == "batch"
        killer = _kill_and_restart_once(broker, settings, batch.epoch, 2, done)
        run_job_process("batch", settings, batch.epoch, timeout=600)
        killer.join(timeout=120)
        assert close_epoch(settings, batch.epoch) == ("completed", batch.boundary), done
        assert_exactly_once(settings)
        print(f"batch: broker {done[-1]}")

        log = KafkaLog(source, broker.config)  # a fresh client after the restart
        produce_backlog(
            log, EventGenerator(seed=12, buckets=PARTITIONS), records=40_000, first=10**6
        )
        stream = decide(settings, force_mode="stream")
        assert stream.start == batch.boundary
        killer = _kill_and_restart_once(broker, settings, stream.epoch, 2, done)
        target = log.latest_offsets()
        with pause_when_caught_up(settings, target):
            run_job_process("stream", settings, stream.epoch, timeout=600)
        killer.join(timeout=120)
        assert close_epoch(settings, stream.epoch) == ("completed", target), done
        assert_exactly_once(settings)
        print(f"stream: broker {done[-1]}")
        log.close()


def test_a_broker_that_stays_down_fails_the_stream_in_bounded_time_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down for longer than ``source_outage_grace``: the stream job fails by itself, saying
    which broker did not answer, instead of waiting for it, and what it committed is there once;
    ``decide`` refuses to open the next epoch on it, as quickly."""
    with KafkaBroker(tmp_path / "broker") as broker:
        source = _topic_with_backlog(broker, monkeypatch, "down", seed=13, records=20_000)
        settings = PipelineSettings.from_mapping(
            {
                "pipeline": "broker_down",
                "source": source,
                "warehouse": str(tmp_path / "warehouse"),
                "max_records_per_trigger": "2000",
                "source_outage_grace": "10s",
                **HELD_IN_STREAM,
            }
        )
        stream = decide(settings, force_mode="stream")
        stopped_at: list[float] = []

        def stop_after_first_commit() -> None:
            deadline = time.monotonic() + 300
            while not any(
                c.epoch == stream.epoch for c in sink_commits(settings.sink, "broker_down")
            ):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.2)
            broker.kill()
            stopped_at.append(time.monotonic())

        stopper = threading.Thread(target=stop_after_first_commit, daemon=True)
        stopper.start()
        job_log = tmp_path / "stream.log"
        with pytest.raises(ModeswitchError, match="exited with status"):
            run_job_process("stream", settings, stream.epoch, timeout=600, log_file=job_log)
        failed_after = time.monotonic() - stopped_at[0]
        stopper.join()
        output = job_log.read_text(errors="replace")
        assert broker.bootstrap in output, output[-3000:]
        assert "source_outage_grace" in output, output[-3000:]
        # The grace, one failed look at the source (its 10 s timeout), the query's stop (at
        # most STREAM_API_TIMEOUT_MS: a request for the latest offsets it waits for): ~40 s
        # of timeouts, the processes' own stop on top (a minute was tight on a slow machine).
        assert failed_after < 90, failed_after

        # The failed epoch is closed where the sink ends; no next one opens on a broker that
        # does not answer.
        status, end = close_epoch(settings, stream.epoch)
        assert status == "completed" and sum(end.values()) > 0
        began = time.monotonic()
        with pytest.raises(ModeswitchError, match=re.escape(broker.bootstrap)):
            decide(settings, force_mode="stream")
        assert time.monotonic() - began < 60

        # What the failed epoch committed is there once: a plain producer's offsets have no
        # gaps, so the sink and the quarantine hold each offset below the end exactly once
        # (the pipeline's convergence once the broker is back: the test above).
        landed = []
        for table in (settings.sink, settings.quarantine):
            if DeltaTable.is_deltatable(table):
                rows = delta_dataset(DeltaTable(table)).to_table(columns=["bucket", "offset"])
                landed += zip(rows["bucket"].to_pylist(), rows["offset"].to_pylist(), strict=True)
        assert sorted(landed) == [(b, o) for b in sorted(end) for o in range(end[b])]
        print(f"stream failed {failed_after:.0f} s after the broker went down")
