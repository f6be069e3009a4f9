"""Probe: what one small append to a Delta table costs beside the log it keeps.

    .venv/bin/python bench/probe_commit_vs_log.py TABLE [--appends 3]

Copies ``TABLE`` (a local Delta table, e.g. the sink of a ``bench/bench_soak.py --workdir``
run) to a temporary folder and times an 8-row append with deltalake three ways: as it is;
after dropping its tombstones (tombstone retention 0, a new checkpoint); and after deleting
the log files below its newest checkpoint, which is what log cleanup does. Prints the log
files, the checkpoint's rows and the best append time of each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from deltalake import DeltaTable, write_deltalake


def best_append(uri: str, appends: int) -> float:
    table = DeltaTable(uri)
    rows = table.to_pyarrow_dataset().head(8)
    times = []
    for _ in range(appends):
        began = time.perf_counter()
        write_deltalake(table, rows, mode="append")
        times.append(time.perf_counter() - began)
    return min(times)


def describe(uri: str) -> str:
    log = Path(uri, "_delta_log")
    last = json.loads((log / "_last_checkpoint").read_text())
    return f"{len(list(log.iterdir())):,} log files, checkpoint of {last['size']:,} rows"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table")
    parser.add_argument("--appends", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="modeswitch-probe-") as work:
        uri = str(Path(work) / "table")
        shutil.copytree(args.table, uri)
        DeltaTable(uri).create_checkpoint()
        print(f"as it is ({describe(uri)}): {best_append(uri, args.appends) * 1000:.0f} ms")
        DeltaTable(uri).alter.set_table_properties(
            {"delta.deletedFileRetentionDuration": "interval 0 seconds"}
        )
        DeltaTable(uri).create_checkpoint()
        print(f"no tombstones ({describe(uri)}): {best_append(uri, args.appends) * 1000:.0f} ms")
        log = Path(uri, "_delta_log")
        newest = json.loads((log / "_last_checkpoint").read_text())["version"]
        for path in log.iterdir():
            if path.name[:20].isdigit() and int(path.name[:20]) < newest:
                path.unlink()
        print(f"log cleaned ({describe(uri)}): {best_append(uri, args.appends) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
