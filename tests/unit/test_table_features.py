"""A table feature the pipeline cannot write beside (a team's ALTER TABLE on the sink) is
refused before anything is written, naming the property that enabled it; the features it
supports (the change data feed among them) are not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from deltalake import DeltaTable, TableFeatures, write_deltalake

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.lifecycle import decide
from modeswitch.sinks.features import (
    UnsupportedTableFeatureError,
    check_tables,
    unsupported_features,
)
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore


def _protocol(reader: int, writer: int, readers=None, writers=None) -> SimpleNamespace:
    return SimpleNamespace(
        min_reader_version=reader,
        min_writer_version=writer,
        reader_features=readers,
        writer_features=writers,
    )


def test_the_protocol_we_write_and_the_supported_features_pass() -> None:
    assert unsupported_features(_protocol(1, 2)) == []
    # What delta-spark makes of it when a team enables the change data feed.
    cdf = _protocol(1, 7, None, ["changeDataFeed", "invariants", "appendOnly"])
    assert unsupported_features(cdf) == []


def test_other_features_and_legacy_versions_are_named() -> None:
    dv = _protocol(3, 7, ["deletionVectors"], ["deletionVectors", "changeDataFeed"])
    assert unsupported_features(dv) == ["deletionVectors"]
    assert unsupported_features(_protocol(2, 5)) == [
        "checkConstraints",
        "columnMapping",
        "generatedColumns",
    ]
    assert unsupported_features(_protocol(1, 3)) == ["checkConstraints"]


@pytest.fixture
def sink(tmp_path: Path) -> str:
    uri = str(tmp_path / "sink")
    write_deltalake(uri, pa.table({"bucket": [0], "offset": [0], "amount": [1.0]}))
    return uri


@pytest.mark.parametrize(
    ("feature", "named"),
    [
        (TableFeatures.DeletionVectors, "deletionVectors (enabled by delta.enableDeletionVectors)"),
        (TableFeatures.V2Checkpoint, "v2Checkpoint (enabled by delta.checkpointPolicy = v2)"),
        (TableFeatures.RowTracking, "rowTracking (enabled by delta.enableRowTracking)"),
    ],
)
def test_a_table_with_an_unsupported_feature_is_refused_by_name(
    sink: str, feature, named: str
) -> None:
    DeltaTable(sink).alter.add_feature(feature, allow_protocol_versions_increase=True)
    with pytest.raises(UnsupportedTableFeatureError, match="features the pipeline cannot") as e:
        check_tables({"sink table": sink})
    assert f"sink table {sink} has" in str(e.value)
    assert named in str(e.value)
    assert "Nothing was written" in str(e.value)


def test_a_check_constraint_is_refused_and_the_change_data_feed_is_not(sink: str) -> None:
    # delta-rs moves the table to writer version 4 (generated columns): none is in use.
    DeltaTable(sink).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    check_tables({"sink table": sink})
    # Column mapping listed, but no mode set: nothing our files would get wrong.
    DeltaTable(sink).alter.add_feature(
        TableFeatures.ColumnMapping, allow_protocol_versions_increase=True
    )
    check_tables({"sink table": sink})
    DeltaTable(sink).alter.add_constraint({"positive": "amount > 0"})
    with pytest.raises(UnsupportedTableFeatureError, match=r"checkConstraints \(enabled by"):
        check_tables({"sink table": sink})


def test_a_transaction_retention_is_refused_naming_the_property(sink: str) -> None:
    """Delta drops an app transaction older than delta.setTransactionRetentionDuration: the
    pipeline's fence would expire while it is paused."""
    DeltaTable(sink).alter.set_table_properties(
        {"delta.setTransactionRetentionDuration": "interval 1 days"}
    )
    with pytest.raises(UnsupportedTableFeatureError) as refused:
        check_tables({"sink table": sink})
    assert "delta.setTransactionRetentionDuration = 'interval 1 days'" in str(refused.value)
    assert "zombie" in str(refused.value) and "Nothing was written" in str(refused.value)


def test_decide_refuses_before_it_opens_an_epoch_or_writes_a_control_table(
    tmp_path: Path,
) -> None:
    settings = PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "log"), "warehouse": str(tmp_path / "wh")}
    )
    produce_backlog(
        SegmentLog.create(settings.source, buckets=2), EventGenerator(seed=1, buckets=2), records=10
    )
    write_deltalake(settings.sink, pa.table({"bucket": [0], "offset": [0]}))
    DeltaTable(settings.sink).alter.add_feature(
        TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )
    version = DeltaTable(settings.sink).version()
    with pytest.raises(UnsupportedTableFeatureError, match=r"delta\.enableDeletionVectors"):
        decide(settings)
    assert not Path(StateStore.from_settings(settings).tables.uri("epochs")).exists()
    assert DeltaTable(settings.sink).version() == version
