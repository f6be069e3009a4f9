"""A rewind through the real pipeline: a batch epoch drains a small backlog, a stream epoch
runs until a rewind command stops it at a commit boundary (the command stays pending),
``decide`` applies the rewind and opens the next epoch at the rewound offsets, and that epoch
reprocesses the range. The audit finds nothing missing or duplicated, and every record of
the rewound range is in the sink or the quarantine exactly once.

The Spark jobs run as child processes (own process group each, killed if they overrun). No
timing is part of what it proves: the stream may run ten minutes, so only the command can have
stopped it within the job's timeout, and the epoch after the rewind reads what the log holds
and ends (``stream_trigger = available_now``, as ``modeswitch run --until caught-up`` does).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.ops.verify import audit
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.runners.local import run_job_process
from modeswitch.sinks.commits import sink_commits
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

BUCKETS = 4
RECORDS = 20_000


@pytest.fixture
def settings(tmp_path: Path) -> PipelineSettings:
    return PipelineSettings.from_mapping(
        {
            "pipeline": "rewind",
            "value_schema": EVENT_VALUE_SCHEMA,  # the demo's events, parsed: some quarantined
            "source": str(tmp_path / "log"),
            "warehouse": str(tmp_path / "warehouse"),
            "trigger_interval": "500ms",
            "max_stream_runtime": "10m",
            "min_time_in_stream": "0s",
            "exit_threshold": "1h",
            "enter_threshold": "2h",
            "watermark_lag_threshold": "2h",
        }
    )


def rows_at(uri: str, bucket: int, low: int, high: int) -> list[int]:
    table = DeltaTable(uri).to_pyarrow_table(
        columns=["offset"], filters=[("bucket", "=", bucket), ("offset", ">=", low)]
    )
    return [o for o in table.column("offset").to_pylist() if o < high]


def test_a_rewind_stops_the_stream_and_the_next_epoch_reprocesses_exactly_once(
    settings: PipelineSettings,
) -> None:
    log = SegmentLog.create(settings.source, buckets=BUCKETS)
    produce_backlog(
        log, EventGenerator(seed=11, buckets=BUCKETS, malformed_fraction=0.01), records=RECORDS
    )
    store = StateStore(settings.state_root, settings.sink, settings.pipeline)

    batch = decide(settings, decided_by="e2e")
    assert batch.mode == "batch"
    run_job_process("batch", settings, batch.epoch, timeout=600)
    assert close_epoch(settings, batch.epoch)[0] == "completed"
    drained = store.progress.committed_offsets()
    rewind_to = {0: drained[0] // 2, 2: 0}

    stream = decide(settings, force_mode="stream", decided_by="e2e")
    assert stream.start == drained

    def rewind_when_streaming() -> None:
        deadline = time.monotonic() + 240
        while not store.progress.list(stream.epoch) and time.monotonic() < deadline:
            time.sleep(0.5)
        store.commands.submit(
            "rewind", {"offsets": {str(b): o for b, o in rewind_to.items()}}, issuer="e2e"
        )

    submitter = threading.Thread(target=rewind_when_streaming)
    submitter.start()
    try:  # killed (and failed) at the timeout unless the command stops it
        run_job_process("stream", settings, stream.epoch, timeout=300)
    finally:
        submitter.join()
    close_epoch(settings, stream.epoch)
    stopped = store.epochs.get(stream.epoch)
    assert "command #1 rewind" in (stopped.end_reason or ""), stopped.end_reason
    assert store.commands.get(1).status == "pending"  # left for decide

    again = decide(settings, decided_by="e2e")
    assert again.reason.startswith('command #1 rewind to {"0":'), again.reason
    assert again.start == {**stopped.end, **rewind_to}
    assert store.commands.get(1).status == "applied"
    assert store.epochs.get(again.epoch).start == again.start
    drain = PipelineSettings.from_mapping(
        {**settings.to_mapping(), "stream_trigger": "available_now"}
    )
    run_job_process(again.mode, drain, again.epoch, timeout=600)
    close_epoch(settings, again.epoch)
    ended = store.epochs.get(again.epoch)
    assert ended.status == "completed"
    for bucket, offset in rewind_to.items():
        assert ended.end[bucket] >= stopped.end[bucket] > offset

    report = audit(settings.source, settings.sink, settings.quarantine, settings.pipeline)
    assert report.ok, report
    assert (report.totals.missing, report.totals.duplicated) == (0, 0)
    assert report.totals.in_quarantine > 0
    # Every record of the rewound ranges is present once: in the sink or the quarantine.
    for bucket, offset in rewind_to.items():
        high = stopped.end[bucket]
        present = Counter(
            rows_at(settings.sink, bucket, offset, high)
            + rows_at(settings.quarantine, bucket, offset, high)
        )
        assert sorted(present) == list(range(offset, high))
        assert set(present.values()) == {1}
    [rewind] = [c for c in sink_commits(settings.sink, settings.pipeline) if c.is_rewind]
    assert (rewind.command, rewind.epoch) == (1, stream.epoch)
