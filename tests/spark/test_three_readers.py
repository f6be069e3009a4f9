"""Every table the pipeline writes opens in three Delta readers alike: Delta's own Spark
connector (delta-spark), delta-rs (``deltalake``) and ClickHouse (chDB, its engine in this
process, through ``deltaLakeLocal``). The tables are what two batch epochs and a maintenance
run between them leave: the sink, the quarantine (malformed records) and the control tables,
each with commits, a checkpoint and compacted files. Each reader must see the same rows, and
each table's protocol must be the one docs/SINK.md says we write (no table feature)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable

from modeswitch.control.settings import PipelineSettings
from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.modes.batch import run_batch_epoch
from modeswitch.modes.job import resolve_job
from modeswitch.ops.maintenance import maintain
from modeswitch.runners.lifecycle import close_epoch, decide
from modeswitch.sources.segments import SegmentLog
from modeswitch.state import StateStore
from modeswitch.state.tables import ORDER, SCHEMAS
from modeswitch.transforms.payload import EVENT_VALUE_SCHEMA

RECORDS = 4_000
WAVE = 1_000


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[int, int], Path]:
    """Table name -> (its location, the columns that identify a row); the log's offsets; the
    folder everything is in."""
    root = tmp_path_factory.mktemp("three-readers")
    settings = PipelineSettings.from_mapping(
        {
            "pipeline": "readers",
            "value_schema": EVENT_VALUE_SCHEMA,
            "source": str(root / "log"),
            "warehouse": str(root / "warehouse"),
            "wave_records": str(WAVE),
            "watermark_lag_threshold": "1h",
            "enter_threshold": "1h",
            "exit_threshold": "1h",
        }
    )
    log = SegmentLog.create(settings.source, buckets=2)
    generator = EventGenerator(seed=9, buckets=2, malformed_fraction=0.05)
    produce_backlog(log, generator, records=RECORDS // 2, chunk=WAVE)
    for records_before in (0, RECORDS // 2):
        if records_before:
            produce_backlog(log, generator, records=RECORDS // 2, first=records_before)
        plan = decide(settings, force_mode="batch")
        run_batch_epoch(spark, resolve_job(settings, "batch"), plan.epoch)
        assert close_epoch(settings, plan.epoch)[0] == "completed"
        if not records_before:
            maintain(settings)  # compacted files and a checkpoint, then more commits on top
    store = StateStore.from_settings(settings)
    found = {
        "sink": (settings.sink, ["bucket", "offset"]),
        "quarantine": (settings.quarantine, ["bucket", "offset"]),
    }
    for name in SCHEMAS:
        found[name] = (store.tables.uri(name), list(ORDER[name]))
    return found, log.latest_offsets(), root


@pytest.fixture(scope="module")
def tables(written) -> dict[str, tuple[str, list[str]]]:
    return written[0]


def _delta_rs(uri: str, keys: list[str]) -> list[tuple]:
    table = DeltaTable(uri).to_pyarrow_table(columns=keys)
    return sorted(zip(*(table.column(k).to_pylist() for k in keys), strict=True))


def _delta_spark(spark, uri: str, keys: list[str]) -> list[tuple]:
    return sorted(
        tuple(row) for row in spark.read.format("delta").load(uri).select(*keys).collect()
    )


CLICKHOUSE = """
import json, sys
import chdb

tables = json.loads(sys.argv[1])
rows = {}
for name, (uri, keys) in tables.items():
    columns = ", ".join(f"toString({k})" for k in keys)
    text = str(chdb.query(f"SELECT {columns} FROM deltaLakeLocal('{uri}')", "TabSeparated"))
    rows[name] = [line.split("\\t") for line in text.splitlines() if line]
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def clickhouse(written) -> dict[str, list[tuple]]:
    """Each table's rows as ClickHouse reads them (as text), in a process of its own: chDB
    reads local files below its working directory only, the folder the tables are in."""
    tables, _, root = written
    done = subprocess.run(
        [sys.executable, "-c", CLICKHOUSE, json.dumps(tables)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: sorted(map(tuple, rows)) for name, rows in json.loads(done.stdout).items()}


def _text(value: object) -> str:
    """A value as ClickHouse's toString writes it."""
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo else value
        return utc.strftime("%Y-%m-%d %H:%M:%S.%f")
    return str(value)


def _naive(value: object) -> object:
    """delta-rs reads timestamps with their zone, Spark in the session's (UTC here)."""
    if isinstance(value, datetime) and value.tzinfo:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


@pytest.mark.parametrize("name", ["sink", "quarantine", *SCHEMAS])
def test_the_three_readers_see_the_same_rows(spark, tables, clickhouse, name: str) -> None:
    uri, keys = tables[name]
    by_delta_rs = _delta_rs(uri, keys)
    assert by_delta_rs, f"the {name} table is empty: nothing to compare"
    by_spark = _delta_spark(spark, uri, keys)
    assert by_spark == sorted(tuple(_naive(v) for v in row) for row in by_delta_rs)
    assert clickhouse[name] == sorted(tuple(_text(v) for v in row) for row in by_delta_rs)
    assert len(set(by_delta_rs)) == len(by_delta_rs), f"a row of {name} is there twice"


def test_the_sink_and_the_quarantine_hold_every_record_once(written) -> None:
    tables, latest, _ = written
    sink = _delta_rs(*tables["sink"])
    quarantined = _delta_rs(*tables["quarantine"])
    assert quarantined, "the generator's malformed records were quarantined"
    assert sum(latest.values()) == RECORDS
    assert sorted(sink + quarantined) == [(b, o) for b in sorted(latest) for o in range(latest[b])]


@pytest.mark.parametrize("name", ["sink", "quarantine", *SCHEMAS])
def test_each_table_has_the_protocol_docs_sink_md_names(tables, name: str) -> None:
    protocol = DeltaTable(tables[name][0]).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features
