"""Benchmark: what the shared transform costs, against reading the same rows and nothing else.

    .venv/bin/python bench/bench_transform.py [--records 2000000] [--rounds 2]

One session, the rows of an embedded log (4 buckets, 0.1 % malformed) read by Spark's Parquet
reader, each variant written to Spark's ``noop`` sink (every row and column is computed, nothing
is stored), rounds alternating: ``scan`` (no transform), ``parse_events`` (the default
transform), ``parse_events_arrow`` (the same columns through ``mapInArrow`` and msgspec, see
:mod:`modeswitch.transforms.arrow`), ``from_json`` (the same parse without the quarantine reason)
and ``variant``
(Spark's ``try_parse_json`` and ``try_variant_get``, an alternative parser). Reports wall time
and the CPU time of the process tree (driver, JVM, Python workers).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_sink import cpu_seconds  # bench/ is on the path: run as a script

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.session import create_spark_session
from modeswitch.sources.segments import SegmentLog
from modeswitch.transforms import EVENT_SCHEMA, QUARANTINE_REASON, parse_events
from modeswitch.transforms.arrow import parse_events_arrow


def from_json_only(df):
    from pyspark.sql import functions as F

    return df.withColumn("_p", F.from_json("value", EVENT_SCHEMA)).select(*df.columns, "_p.*")


def variant_parse(df):
    from pyspark.sql import functions as F

    parsed = df.withColumn("_v", F.expr("try_parse_json(value)"))
    fields = [
        F.expr(f"try_variant_get(_v, '$.{f.name}', '{f.dataType.simpleString()}')").alias(f.name)
        for f in EVENT_SCHEMA.fields
    ]
    reason = F.when(F.col("_v").isNull(), F.lit("value is not valid JSON"))
    return parsed.select(*df.columns, *fields, reason.alias(QUARANTINE_REASON))


VARIANTS: dict[str, Callable] = {
    "scan": lambda df: df,
    "parse_events": parse_events,
    "parse_events_arrow": parse_events_arrow,
    "from_json": from_json_only,
    "variant": variant_parse,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="modeswitch-bench-transform-") as work:
        log = SegmentLog.create(f"{work}/log", buckets=4)
        produce_backlog(
            log, EventGenerator(seed=1, buckets=4, malformed_fraction=0.001), records=args.records
        )
        spark = create_spark_session("modeswitch-bench-transform")
        try:
            files = [str(p) for p in Path(log.root).rglob("*.parquet")]
            source = spark.read.parquet(*files)
            print(f"{source.count():,} records; rounds alternate the variants")
            print("| round | variant | wall (s) | CPU (s) |\n|---|---|---|---|")
            for round_ in range(1, args.rounds + 1):
                for name, transform in VARIANTS.items():
                    began, cpu = time.perf_counter(), cpu_seconds()
                    transform(source).write.format("noop").mode("overwrite").save()
                    wall, cpu = time.perf_counter() - began, cpu_seconds() - cpu
                    print(f"| {round_} | {name} | {wall:.2f} | {cpu:.1f} |", flush=True)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
