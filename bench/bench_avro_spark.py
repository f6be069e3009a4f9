"""Benchmark: an Avro payload's decode in Spark, both forms, against the JSON parse's.

    .venv/bin/python bench/bench_avro_spark.py [--records 2000000] [--rounds 2]

One session (local[2]), the demo's events kept as a source keeps values (text; the prefix and
base64 where the bytes are not UTF-8) in Parquet files, once as JSON and once as
registry-framed Avro. Each variant is written to Spark's ``noop`` sink (every row and column
computed, nothing stored), rounds alternating: ``scan`` (the Avro rows, no decode),
``json from_json`` (the default transform's Spark form), ``json msgspec`` (its Arrow form in
``mapInArrow``), ``avro fastavro`` (the Avro transform's Arrow form, its fastavro decoder, in
``mapInArrow``) and ``avro from_avro`` (its Spark form: Spark's own Avro reader,
:mod:`modeswitch.transforms.avro_spark`). Then what the values' text costs, on the same Avro
values kept as bytes (as Spark's Kafka source gives them): ``bytes scan``, ``bytes to text``
(the Kafka source's conversion to the records' text ``value``,
:mod:`modeswitch.sources.spark_kafka`) and ``bytes from_avro`` (Spark's reader on each body
after the framing, with no reasons: the floor of a form on bytes). Reports wall time and the
CPU time of the process tree.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
from bench_avro import EVENT_AVRO, avro_values, events  # bench/ is on the path
from bench_sink import cpu_seconds
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from modeswitch.runners.session import create_spark_session
from modeswitch.sources.spark_kafka import bytes_as_text
from modeswitch.transforms import parse_events
from modeswitch.transforms.arrow import parse_events_arrow
from modeswitch.transforms.avro import AvroDecoder, transform_of


def arrow_form_in_spark(transform, df):
    """The transform's Arrow form (fastavro) run by Spark in ``mapInArrow``."""
    form = transform.arrow(df.schema)
    return df.mapInArrow(form.function, form.schema)


def table(values: list[str] | list[bytes]) -> pa.Table:
    n = len(values)
    kind = pa.binary() if values and isinstance(values[0], bytes) else pa.string()
    return pa.table(
        {
            "bucket": pa.array([i % 4 for i in range(n)], pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "event_time": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            "key": pa.array([None] * n, kind),
            "value": pa.array(values, kind),
        }
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    records = events(args.records)
    decoder = AvroDecoder(
        json.dumps(EVENT_AVRO), {1: (1, json.dumps(EVENT_AVRO))}, subject="e", version=1, what="b"
    )
    avro_form = transform_of(decoder)
    with tempfile.TemporaryDirectory(prefix="modeswitch-bench-avro-") as work:
        pq.write_table(
            table([json.dumps(r, separators=(",", ":")) for r in records]), f"{work}/j.parquet"
        )
        pq.write_table(table(avro_values(records)), f"{work}/a.parquet")
        pq.write_table(table(avro_values(records, raw=True)), f"{work}/b.parquet")
        del records
        spark = create_spark_session("modeswitch-bench-avro", master="local[2]")
        try:
            json_rows = spark.read.parquet(f"{work}/j.parquet").repartition(8).cache()
            avro_rows = spark.read.parquet(f"{work}/a.parquet").repartition(8).cache()
            avro_bytes = spark.read.parquet(f"{work}/b.parquet").repartition(8).cache()
            print(f"{json_rows.count():,} JSON and {avro_rows.count():,} Avro records (cached)")
            print(f"{avro_bytes.count():,} Avro records as bytes (cached)")
            body = F.substring("value", 6, 1 << 30)  # after the magic byte and the schema id
            variants = {
                "scan": lambda: avro_rows,
                "json from_json": lambda: parse_events(json_rows),
                "json msgspec": lambda: parse_events_arrow(json_rows),
                "avro fastavro": lambda: arrow_form_in_spark(avro_form, avro_rows),
                "avro from_avro": lambda: avro_form.spark(avro_rows),
                "bytes scan": lambda: avro_bytes,
                "bytes to text": lambda: avro_bytes.select(
                    bytes_as_text(F.col("value")).alias("value")
                ),
                "bytes from_avro": lambda: avro_bytes.select(
                    from_avro(body, json.dumps(EVENT_AVRO)).alias("p")
                ).select("p.*"),
            }
            print("| round | variant | wall (s) | CPU (s) |\n|---|---|---|---|")
            for round_ in range(1, args.rounds + 1):
                for name, frame in variants.items():
                    began, cpu = time.perf_counter(), cpu_seconds()
                    frame().write.format("noop").mode("overwrite").save()
                    wall, cpu = time.perf_counter() - began, cpu_seconds() - cpu
                    print(f"| {round_} | {name} | {wall:.2f} | {cpu:.1f} |", flush=True)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
