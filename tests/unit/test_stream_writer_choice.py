"""The ``stream_writer`` setting and the commit record the ``delta_spark`` writer leaves in
``userMetadata`` (the only field of ``commitInfo`` delta-spark lets a writer set)."""

from __future__ import annotations

import json

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ConfigError
from modeswitch.sinks.commits import (
    SinkCommit,
    quarantine_record,
    user_metadata_record,
)

BASE = {"pipeline": "p", "source": "/tmp/log", "warehouse": "/tmp/wh"}


def test_the_default_stream_writer_is_auto_and_delta_spark_can_be_chosen() -> None:
    assert PipelineSettings.from_mapping(BASE).stream_writer == "auto"
    chosen = PipelineSettings.from_mapping({**BASE, "stream_writer": " Delta_Spark "})
    assert chosen.stream_writer == "delta_spark"


def test_an_unknown_stream_writer_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="stream_writer") as caught:
        PipelineSettings.from_mapping({**BASE, "stream_writer": "delta-rs"})
    assert "delta-rs" in str(caught.value)


COMMIT = SinkCommit(
    pipeline="p",
    epoch=3,
    mode="stream",
    sequence=7,
    start={0: 10, 1: 4},
    end={0: 20, 1: 9},
    records=14,
    max_event_time_us={0: 1_700_000_000_000_000},
    quarantined=1,
    quarantine_reasons={"not JSON": 1},
)
QUARANTINE = {
    "records": 1,
    "reasons": {"not JSON": 1},
    "files": [{"path": "part-1.parquet", "size": 10}],
}


def test_a_commit_record_in_user_metadata_reads_back_as_the_commit() -> None:
    raw = user_metadata_record(COMMIT, QUARANTINE)
    shown = json.loads(raw)  # what DESCRIBE HISTORY's userMetadata column shows
    assert (shown["writer"], shown["kind"], shown["epoch"], shown["records"]) == (
        "modeswitch",
        "stream",
        3,
        14,
    )
    info = {"userMetadata": raw, "version": 12, "timestamp": 5}
    back = SinkCommit.from_commit_info(info)
    assert back is not None
    assert (back.start, back.end, back.records, back.sequence) == (
        COMMIT.start,
        COMMIT.end,
        14,
        7,
    )
    assert back.max_event_time_us == COMMIT.max_event_time_us
    assert (back.quarantined, back.quarantine_reasons) == (1, {"not JSON": 1})
    assert back.table_version == 12
    assert quarantine_record(info) == QUARANTINE


def test_other_user_metadata_is_not_taken_for_a_commit_of_ours() -> None:
    summary_only = json.loads(user_metadata_record(COMMIT))
    del summary_only["modeswitch"]  # the summary our delta-rs commits show
    for raw in (
        "nightly compaction by the data team",
        '{"modeswitch": "a user\'s own note"}',
        json.dumps(summary_only),
    ):
        assert SinkCommit.from_commit_info({"userMetadata": raw, "version": 1}) is None
        assert quarantine_record({"userMetadata": raw}) is None
