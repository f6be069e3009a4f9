"""A process that read a Delta table (the control tables, the quarantine) exits with status 0.

Read through deltalake's own filesystem handler, such a process aborted at exit ("terminate
called without an active exception", SIGABRT) in about a third of runs here; `modeswitch run`
ended that way once in four runs (the Kafka issue). Each run below is a fresh interpreter
that reads a table of twenty files the way the control tables, `modeswitch status` and
backfills read theirs (`modeswitch.storage.delta_dataset`); twelve runs all exit 0 (at a
third each, the chance that twelve broken runs all pass is 0.8 %).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from modeswitch.storage import delta_dataset

    path = sys.argv[1] + "/table"
    if sys.argv[2] == "write":  # a table of twenty files, like a control table between compactions
        for n in range(20):
            rows = pa.table({"n": list(range(n * 100, n * 100 + 100))})
            write_deltalake(path, rows, mode="append")
    print(delta_dataset(DeltaTable(path)).to_table().num_rows)
    """
)


def test_a_process_that_read_a_delta_table_exits_cleanly(tmp_path) -> None:
    def run(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", SCRIPT, str(tmp_path), action],
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = run("write")
    assert first.returncode == 0, first.stderr[-2000:]
    codes = [run("read") for _ in range(12)]
    assert [c.returncode for c in codes] == [0] * 12, [c.stderr[-300:] for c in codes]
    assert all(c.stdout.strip() == "2000" for c in codes)
