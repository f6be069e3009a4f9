"""A class-data-sharing (CDS) archive for Spark's driver JVM: Spark starts much faster with it.

A Spark driver JVM spends most of its start-up loading and verifying classes from Spark's
jars. Java 17 can dump the classes a run loaded into an archive (``-XX:ArchiveClassesAtExit``)
and map that archive into later JVMs (``-XX:SharedArchiveFile``). Measured on this project's
2-core machine (see docs/BENCHMARKS.md): a session plus its first job went from ~21 s to
~12.5 s under load, which is most of what a stream epoch waits for at a handoff.

``python -m modeswitch.runners.jvm`` (run by ``make install``) makes the archive once: a child
process starts a session that dumps its classes at exit, runs a small workload through the
``bucketlog`` source and the ``modeswitch_delta`` sink (batch and streaming), and stops. The
archive is written aside and renamed into place, so a concurrent reader never maps half a
file. It lives under ``$MODESWITCH_CACHE`` (default ``~/.cache/modeswitch``), named after
what it depends on: the Java runtime and Spark's jars (their folder too: the JVM checks its
class path against the archive's). A JVM that cannot use it (another Java) says so in one
warning line and starts as it would have anyway.
``MODESWITCH_CDS=off`` turns it off.

The jars Spark gets beside its own (:func:`fetched_jars`): delta-spark and what it needs that
pyspark lacks, listed in ``jvm/pom.xml`` and copied by ``make install`` into ``.jars/`` at the
repository's top (``$MODESWITCH_JARS`` names another folder). Every session of ours puts
exactly those on its class path (:mod:`modeswitch.runners.session`, the Airflow operator's
spark-submit), and the archive's name follows them, so a new set of jars gets a new archive.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from modeswitch.environment import CACHE, CDS, JARS, env_value
from modeswitch.errors import ModeswitchError

log = logging.getLogger(__name__)

ENV_CACHE = CACHE.name
ENV_SWITCH = CDS.name
ENV_JARS = JARS.name
JARS_FOLDER = JARS.default
"""Where ``make install`` copies ``jvm/pom.xml``'s jars (``.jars/`` at the repository's top)."""


def jars_folder() -> Path:
    """The folder of the fetched jars: ``$MODESWITCH_JARS``, else :data:`JARS_FOLDER`."""
    return env_value(JARS)


def fetched_jars() -> list[str]:
    """The jars every Spark session of ours adds to Spark's own (``spark.jars``): absolute
    paths, sorted. Raises :class:`ModeswitchError` when ``make install`` has not fetched them."""
    folder = jars_folder()
    jars = sorted(str(path) for path in folder.glob("*.jar")) if folder.is_dir() else []
    if not jars:
        raise ModeswitchError(
            f"no jars in {folder}: run `make install`, which fetches delta-spark and the other "
            f"artifacts of jvm/pom.xml there (or set {ENV_JARS} to a folder that holds them)"
        )
    return jars


def cache_root() -> Path:
    """``$MODESWITCH_CACHE``, else ``~/.cache/modeswitch``: files made once per machine."""
    return env_value(CACHE)


def enabled() -> bool:
    return env_value(CDS)


def java_executable() -> Path | None:
    """``$JAVA_HOME/bin/java``, else the ``java`` on the PATH (resolved), or None."""
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is None or not candidate.exists():
        found = shutil.which("java")
        candidate = Path(found) if found else None
    return candidate.resolve() if candidate else None


def archive_path() -> Path | None:
    """Where the archive for this Java, these Spark jars and :func:`fetched_jars` lives (None
    without Java)."""
    java = java_executable()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    stat = java.stat()
    # The JVM checks that it runs with the class path it dumped with: the jars' folder is part
    # of the name, so every virtualenv gets its own archive. The fetched jars too: an archive
    # dumped with other ones would miss (or hold stale) Delta classes.
    depends = [str(java), str(stat.st_size), str(stat.st_mtime_ns), str(jars.resolve())]
    key = "\n".join([*depends, *names, *fetched_jars()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / "cds" / f"spark-{pyspark.__version__}-{digest}.jsa"


def java_options() -> str:
    """The driver JVM option that maps the archive, or "" (no archive yet, or turned off)."""
    if not enabled():
        return ""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path}"


def with_java_options(existing: str | None, options: str) -> str:
    """``existing`` JVM options with ``options`` added (unless already there)."""
    existing = (existing or "").strip()
    if not options or options in existing:
        return existing
    return f"{existing} {options}".strip()


_WORKLOAD = """
import os, sys, json, tempfile
from modeswitch.runners.session import create_spark_session
from modeswitch.sources.segments import SegmentLog
from modeswitch.modes.warmup import append_warm_up_events
from modeswitch.transforms import load_transform

dump = "-XX:ArchiveClassesAtExit=" + sys.argv[1]
spark = create_spark_session("modeswitch-cds", conf={"spark.driver.extraJavaOptions": dump})
work = tempfile.mkdtemp(prefix="modeswitch-cds-")
log = SegmentLog.create(work + "/log", buckets=2)
append_warm_up_events(log, 2000)
transform = load_transform("modeswitch.transforms:parse_events")
start = json.dumps({"0": 0, "1": 0})
end = json.dumps({str(b): o for b, o in log.latest_offsets().items()})
options = {"pipeline": "cds", "mode": "batch", "quarantinePath": work + "/quarantine"}
(transform(spark.read.format("bucketlog").option("endingOffsets", end).load(log.root))
    .write.format("modeswitch_delta").mode("append").options(**options)
    .option("epoch", "1").option("sequence", "0").option("offsetsStart", start)
    .option("offsetsEnd", end).save(work + "/sink"))
append_warm_up_events(log, 2000)
stream = spark.readStream.format("bucketlog").option("startingOffsets", end).load(log.root)
query = (transform(stream)
    .withWatermark("event_time", "10 seconds").writeStream.format("modeswitch_delta")
    .options(**options).option("mode", "stream").option("epoch", "2").option("offsetsStart", end)
    .option("checkpointLocation", work + "/checkpoint").trigger(availableNow=True)
    .start(work + "/sink"))
query.awaitTermination()
from pyspark import SparkContext
proc = SparkContext._gateway.proc
spark.stop()
proc.stdin.close()  # the JVM exits on EOF, and dumps its classes as it does
proc.wait(timeout=300)
"""


def make_archive(*, force: bool = False, timeout: float = 600) -> Path | None:
    """Make the archive if it is missing (or ``force``); returns its path, None if no Java.

    Failing to make it is not an error: Spark starts without it, only slower.
    """
    path = archive_path()
    if path is None or not enabled():
        return None
    if path.is_file() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.tmp")
    env = {**os.environ, ENV_SWITCH: "off"}  # the dumping JVM must not map an old archive
    with tempfile.TemporaryFile() as output:
        try:
            code = subprocess.run(
                [sys.executable, "-c", _WORKLOAD, str(tmp)],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                start_new_session=True,
            ).returncode
        except subprocess.TimeoutExpired:
            code = -1
        if code != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            output.seek(0)
            tail = output.read().decode(errors="replace")[-2000:]
            log.warning("no JVM class archive (exit %s); Spark starts without it:\n%s", code, tail)
            tmp.unlink(missing_ok=True)
            return None
    os.replace(tmp, path)
    return path


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    force = "--force" in sys.argv[1:]
    existed = (archive_path() or Path("/nonexistent")).is_file()
    path = make_archive(force=force)
    if path is None:
        print("JVM class archive: not made (Spark starts without it)")
    elif existed and not force:
        print(f"JVM class archive: {path} (already there)")
    else:
        print(f"JVM class archive: {path} ({path.stat().st_size / 2**20:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
