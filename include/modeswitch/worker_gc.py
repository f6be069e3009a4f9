"""What a Spark Python worker keeps out of the garbage collector's way.

A reused Python worker (``spark.python.worker.reuse``) runs ``gc.collect()`` after every task
(pyspark's ``daemon.py``). A full collection walks every object the process tracks, most of
them made once by its imports (pyspark, pyarrow, pandas, deltalake, this package): 80 000
objects and 45 ms a collection in a worker of a stream epoch here, once per task, every
micro-batch. :func:`freeze_imports` moves what exists at a task's start into the collector's
permanent generation (``gc.freeze()``), once per process, so later collections walk only what
later tasks made. Frozen objects are still freed by reference counting; only cycles among
them stay until the worker exits.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_imports() -> None:
    """Freeze the objects this process holds now, the first time it is called (cheap after)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.collect()  # what is garbage already goes, not into the permanent generation
        gc.freeze()
