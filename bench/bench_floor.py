"""Benchmark: the floor of a batch epoch's work in one Python process on ONE core, without
Spark: read the log's segments, parse ``value`` into the event columns with the quarantine
reason, write Parquet. What the batch job (Spark, two cores) is measured against.

    .venv/bin/python bench/bench_floor.py [--records 10000000] [--parse msgspec|pyarrow]

``--parse msgspec`` (default) is :class:`modeswitch.transforms.arrow.PayloadParser`, the parse of
the ``arrow_parse`` transform, with every quarantine decision; ``--parse pyarrow`` is pyarrow's
own JSON reader on the newline-joined values (no per-record decisions: a batch holding one
malformed record fails whole, so the log is made without malformed records for it). The
process is pinned to one core (``os.sched_setaffinity``) and pyarrow to one thread. The log
(16 buckets, Zipf 1.1, 0.1 % malformed) is written first, outside the timing.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms.arrow import QUARANTINE_REASON, PayloadParser

BUCKETS = 16
FIELDS = [
    ("event_id", "long"),
    ("user_id", "long"),
    ("action", "string"),
    ("amount", "double"),
    ("country", "string"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--parse", choices=["msgspec", "pyarrow"], default="msgspec")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    with tempfile.TemporaryDirectory(prefix="modeswitch-bench-floor-") as work:
        log = SegmentLog.create(f"{work}/log", buckets=BUCKETS)
        malformed = 0.001 if args.parse == "msgspec" else 0.0
        generator = EventGenerator(
            seed=1, buckets=BUCKETS, skew="zipf:1.1", malformed_fraction=malformed
        )
        produce_backlog(log, generator, records=args.records)
        payload = PayloadParser(FIELDS, [n for n, _ in FIELDS])
        schema = payload.schema
        out = Path(work) / "out"
        out.mkdir()
        began, records, quarantined = time.perf_counter(), 0, 0
        for bucket, end in log.latest_offsets().items():
            with pq.ParquetWriter(out / f"{bucket}.parquet", _out_schema(schema)) as writer:
                for batch in log.read(bucket, 0, end):
                    values = batch.column("value")
                    if args.parse == "msgspec":
                        columns, reasons = payload.parse(values)
                    else:
                        text = "\n".join(values.to_pylist()).encode()
                        parsed = pajson.read_json(
                            io.BytesIO(text),
                            parse_options=pajson.ParseOptions(explicit_schema=schema),
                        )
                        columns = [parsed.column(n).combine_chunks() for n in payload.names]
                        reasons = pa.nulls(len(values), pa.string())
                    quarantined += reasons.null_count != len(reasons)
                    writer.write_batch(
                        pa.RecordBatch.from_arrays(
                            [*batch.columns, *columns, reasons], schema=_out_schema(schema)
                        )
                    )
                    records += batch.num_rows
        took = time.perf_counter() - began
    print(
        f"{args.parse}: {records:,} records in {took:.1f} s on one core: "
        f"{records / took:,.0f} records/s (batches with a quarantined record: {quarantined})"
    )
    return 0


def _out_schema(payload: pa.Schema) -> pa.Schema:
    from modeswitch.sources.base import RECORD_SCHEMA

    return pa.schema([*RECORD_SCHEMA, *payload, pa.field(QUARANTINE_REASON, pa.string())])


if __name__ == "__main__":
    sys.exit(main())
