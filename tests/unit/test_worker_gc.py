"""Python workers freeze what their imports made, once, so the collection after each task
walks only what tasks made."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_first_task_freezes_the_imports_and_later_collections_skip_them() -> None:
    shown = _run(
        """
        import gc, time
        import pyarrow, pyspark.worker, modeswitch.sources.spark, modeswitch.sinks.files
        from modeswitch.worker_gc import freeze_imports
        assert gc.get_freeze_count() == 0
        freeze_imports()
        frozen = gc.get_freeze_count()
        freeze_imports()  # once per process
        print(frozen > 20_000, gc.get_freeze_count() == frozen)
        """
    )
    assert shown == "True True"


def test_a_sink_task_and_a_source_task_freeze_their_worker(tmp_path) -> None:
    shown = _run(
        f"""
        import gc
        import pyarrow as pa
        from modeswitch.sinks.files import write_files
        from modeswitch.sinks.options import DeltaSinkOptions
        from modeswitch.sources.segments import SegmentLog
        from modeswitch.sources.spark import BucketRanges, read_ranges
        from modeswitch.sources.spark_options import BucketLogOptions

        options = DeltaSinkOptions.parse(
            {{"path": "{tmp_path}/sink", "pipeline": "p", "epoch": "1"}}
        )
        batch = pa.RecordBatch.from_pydict({{"bucket": [0], "offset": [0], "value": ["v"]}})
        write_files(options, iter([batch]))
        sink = gc.get_freeze_count()
        gc.unfreeze()
        import modeswitch.worker_gc
        modeswitch.worker_gc._frozen = False
        log = SegmentLog.create("{tmp_path}/log", buckets=1)
        source = BucketLogOptions.parse({{"path": log.root}})
        list(read_ranges(source, BucketRanges([(0, 0, 0)])))
        print(sink > 0, gc.get_freeze_count() > 0)
        """
    )
    assert shown == "True True"
