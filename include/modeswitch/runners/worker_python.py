"""The interpreter Spark starts its Python workers with, on this machine's masters.

Spark puts ``pyspark.zip``, py4j's source zip and the ``spark-core`` jar of ``$SPARK_HOME``
first on every Python worker's ``PYTHONPATH`` (``PythonUtils.sparkPythonPath``), ahead of the
interpreter's own site-packages. With pip's pyspark those are copies of what site-packages
already holds, and importing from a zip costs twice: Python compiles each module's source
afresh in every worker process (a zip caches no bytecode), and every task calls
``importlib.invalidate_caches()`` (``worker_util.setup_spark_files``), which re-reads the
directory of each zip and jar on the path (spark-core's jar has thousands of entries). Sampled
with py-spy, that was 64 % of the Python workers' samples while a stream epoch started and
still a tenth of them per micro-batch once it ran.

:func:`worker_python` writes (once) a small launcher that drops exactly those entries when
they lie inside this interpreter's own pyspark (so the modules come from site-packages, with
their bytecode cached) and runs this interpreter; everything else on the path is kept. A
stream epoch of 120 000 records at 2 000 a micro-batch plus its batch epoch used 75.8 and
81.1 CPU-s with it against 92.2 and 89.1 without (alternating runs, same hour). It is used on
masters whose executors run on this machine (``local``, a standalone master on loopback); on
other clusters the executors' own interpreter (``spark.pyspark.python``) applies, unless
they run this same installation (:data:`~modeswitch.environment.WORKERS_LIKE_HERE`: the
compose stack).

``python -m modeswitch.runners.worker_python`` writes the launcher and prints its path (an
image makes it when built, for the executors of every container made from it).
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from modeswitch.runners import fork_client
from modeswitch.runners.fork_server import FORKED_MODULES, socket_dir
from modeswitch.runners.jvm import cache_root

_LAUNCHER = """#!/bin/sh
# Written by modeswitch (modeswitch.runners.worker_python): Spark's Python workers, with
# pyspark and py4j imported from {python}'s site-packages instead of
# $SPARK_HOME's zips, where they are the same code without cached bytecode.
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    {home}/python/lib/*.zip|{home}/jars/*.jar) ;;
    *) kept=${{kept:+$kept:}}$entry ;;
  esac
done
unset IFS
PYTHONPATH=$kept
export PYTHONPATH
# A stream's source runner: forked by this JVM's fork server if one listens
# (modeswitch.runners.fork_server), its imports already done.
case $1 in
  -m)
    case $2 in
      {forked})
        if [ -S "{forks}/$PPID.sock" ]; then
          exec {python} -I -S {client} "{forks}/$PPID.sock" "$@"
        fi ;;
    esac ;;
esac
exec {python} "$@"
"""


def launcher_text(python: str, spark_home: str, forks: str, client: str) -> str:
    """The launcher's text for interpreter ``python`` whose pyspark lives in ``spark_home``;
    ``forks``: the folder of the fork servers' sockets, ``client``: the fork client's file
    (:mod:`modeswitch.runners.fork_server`)."""
    for path in (python, spark_home, forks, client):
        if any(c in path for c in "'\"$`\\ \n*?[]:"):
            raise ValueError(f"{path!r}: a path the launcher cannot quote")
    return _LAUNCHER.format(
        python=python,
        home=spark_home.rstrip("/"),
        forks=forks.rstrip("/"),
        client=client,
        forked="|".join(FORKED_MODULES),
    )


def spark_home_of(pyspark_file: str) -> str:
    """The folder of the pyspark installation whose ``__init__.py`` is ``pyspark_file``, also
    where pyspark was imported from that installation's own zip (a driver under
    ``spark-submit``: ``<home>/python/lib/pyspark.zip/pyspark/__init__.py``), so that every
    process of one installation writes, and uses, the same launcher."""
    path = Path(pyspark_file)
    zipped = next((parent for parent in path.parents if parent.suffix == ".zip"), None)
    if zipped is not None:
        return str(zipped.parents[2].resolve())  # <home>/python/lib/pyspark.zip
    return str(path.resolve().parent)


def worker_python() -> str:
    """The path of the launcher for this interpreter (written on first use), or
    ``sys.executable`` when this interpreter's pyspark cannot be found or its path cannot be
    written into a shell script as is."""
    try:
        import pyspark
    except ImportError:
        return sys.executable
    try:
        text = launcher_text(
            sys.executable,
            spark_home_of(pyspark.__file__),
            str(socket_dir()),
            fork_client.__file__,
        )
    except ValueError:
        return sys.executable
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = cache_root() / "python" / f"spark-worker-python-{digest}"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        aside.write_text(text)
        aside.chmod(0o755)
        os.replace(aside, path)  # a concurrent reader sees all of it or none
    return str(path)


def runs_here(master: str | None) -> bool:
    """Whether executors of ``master`` run on this machine: ``local``, ``local[...]``, or a
    standalone master on loopback (``spark://127.0.0.1[:port]``, ``spark://localhost``)."""
    master = (master or "local").strip().lower()
    if master.startswith("local"):
        return True
    parsed = urlsplit(master)
    return parsed.scheme == "spark" and parsed.hostname in {"127.0.0.1", "localhost"}


def python_for(master: str | None) -> str:
    """The interpreter for the Python workers of ``master``: :func:`worker_python` where they
    run on this machine, or on a cluster whose executors run this same installation
    (:data:`~modeswitch.environment.WORKERS_LIKE_HERE`: the compose stack's image, which made
    the launcher when it was built); else this interpreter's path (the cluster's must match
    it)."""
    from modeswitch.environment import WORKERS_LIKE_HERE, env_value

    like_here = runs_here(master) or env_value(WORKERS_LIKE_HERE)
    return worker_python() if like_here else sys.executable


if __name__ == "__main__":
    print(worker_python())
