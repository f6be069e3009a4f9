"""A job the local runner started that fails says why in the runner's error, not only its exit
status: ``modeswitch run``'s user (and the fault tests, which tell a broker's outage by the
broker's address in the error) reads the cause without opening the job's log. Each try of an
epoch appends to the same log file, so only what this try wrote counts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.errors import ModeswitchError
from modeswitch.runners import local
from modeswitch.runners.jobs import task_failure
from modeswitch.runners.local import job_failure, run_job_process

FAILED = (
    "2026-11-28 00:33:30,018 ERROR modeswitch.jobs: stream epoch 2 failed: kafka "
    "127.0.0.1:35731: metadata of topic 'chaos' failed within 10 s; is the broker reachable?"
)


def test_the_last_failure_line_of_what_the_job_wrote_is_its_failure(tmp_path: Path) -> None:
    log = tmp_path / "epoch-2-stream.log"
    log.write_text(
        "2026-11-28 00:33:08,130 INFO modeswitch.jobs: batch epoch 1: 3 waves\n"
        "2026-11-28 00:33:20,000 ERROR modeswitch.sources.kafka: FAIL [rdkafka] refused\n"
        f"{FAILED}\n"
    )
    assert job_failure(log) == (
        "stream epoch 2 failed: kafka 127.0.0.1:35731: metadata of topic 'chaos' failed "
        "within 10 s; is the broker reachable?"
    )
    assert job_failure(None) is None
    assert job_failure(tmp_path / "none.log") is None


def test_an_earlier_tries_failure_is_not_this_ones(tmp_path: Path) -> None:
    log = tmp_path / "epoch-2-stream.log"
    log.write_text(f"{FAILED}\n")
    since = log.stat().st_size
    with open(log, "a") as out:
        out.write("2026-11-28 00:34:00,000 INFO modeswitch.modes.stream: stream epoch 2 starts\n")
    assert job_failure(log, since) is None


def _job(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """The runner's job command replaced by a Python one-liner."""
    monkeypatch.setattr(
        local, "job_command", lambda kind, settings, epoch: [sys.executable, "-c", code]
    )


def test_the_runners_error_ends_with_the_jobs_own_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = PipelineSettings.from_mapping({"pipeline": "p", "source": str(tmp_path / "s")})
    log = tmp_path / "epoch-2-stream.log"
    log.write_text("2026-11-28 00:30:00,000 ERROR modeswitch.jobs: stream epoch 2 failed: old\n")
    _job(monkeypatch, f"print({FAILED!r}); raise SystemExit(1)")
    with pytest.raises(ModeswitchError) as failed:
        run_job_process("stream", settings, 2, log_file=log, timeout=60)
    assert str(failed.value) == (
        "-c for epoch 2 exited with status 1: stream epoch 2 failed: kafka 127.0.0.1:35731: "
        "metadata of topic 'chaos' failed within 10 s; is the broker reachable?"
    )
    # A job that said nothing (killed, or crashed before its logging): the status alone, as
    # the fault tests expect of a SIGKILLed job.
    _job(monkeypatch, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(ModeswitchError) as killed:
        run_job_process("stream", settings, 2, log_file=log, timeout=60)
    assert str(killed.value).endswith("exited with status -9")


def test_a_killed_jobs_spark_scratch_is_removed_and_a_runners_own_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a SIGKILLed JVM leaves in its local dirs and its java.io.tmpdir (``spark-*``,
    ``blockmgr-*``, unpacked native libraries: 23 MB a driver) is in a folder of the job's
    own, removed when the job's group is gone, not in the machine's /tmp."""
    monkeypatch.delenv("SPARK_LOCAL_DIRS", raising=False)
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    settings = PipelineSettings.from_mapping({"pipeline": "p", "source": str(tmp_path / "s")})
    log = tmp_path / "job.log"
    _job(
        monkeypatch,
        "import os, signal, pathlib; d = pathlib.Path(os.environ['SPARK_LOCAL_DIRS']); "
        "(d / 'spark-left').mkdir(); print('scratch', d, os.environ['SPARK_SUBMIT_OPTS'], "
        "flush=True); os.kill(os.getpid(), signal.SIGKILL)",
    )
    with pytest.raises(ModeswitchError, match="status -9"):
        run_job_process("stream", settings, 2, log_file=log, timeout=60)
    _, folder, options = log.read_text().split()
    assert Path(folder).name.startswith("modeswitch-spark-")
    assert options == f"-Djava.io.tmpdir={folder}"
    assert not Path(folder).exists()
    # A runner's scratch (its environment's) is the runner's to remove.
    own = tmp_path / "runner-scratch"
    own.mkdir()
    with pytest.raises(ModeswitchError, match="status -9"):
        run_job_process(
            "stream", settings, 2, log_file=log, timeout=60, env={"SPARK_LOCAL_DIRS": str(own)}
        )
    assert (own / "spark-left").is_dir()


def _worker_error(text: str) -> Exception:
    """What Spark raises in the driver for an error in a task's Python worker (the captured
    form, which needs a JVM to be made, is a subclass of this one with the same text)."""
    from pyspark.errors import PythonException

    return PythonException(
        message=f"An exception was thrown from the Python worker:\nTraceback (most recent call "
        f'last):\n  File "/x/arrow_wave.py", line 127, in __call__\n{text}\n'
    )


def test_a_modeswitch_error_raised_in_a_spark_task_is_the_jobs_failure() -> None:
    broker = (
        "modeswitch.errors.ModeswitchError: kafka 127.0.0.1:60941: metadata of topic 'chaos' "
        "failed within 10 s; is the broker reachable and the topic there?"
    )
    assert task_failure(_worker_error(broker)) == (
        "kafka 127.0.0.1:60941: metadata of topic 'chaos' failed within 10 s; is the broker "
        "reachable and the topic there?"
    )
    # Any other error in a task, or outside Spark, stays the crash it is (its traceback).
    assert task_failure(_worker_error("ZeroDivisionError: division by zero")) is None
    assert task_failure(ValueError(broker)) is None


def _unknown_ids(ids: list[int]) -> tuple[list[object], object]:
    """A batch job's run whose values name each of ``ids`` in turn (in Spark's text for a
    ``raise_error``, as the Spark form raises it), then succeeds; and the ``seen`` each run
    was resolved with."""
    from modeswitch.transforms.avro import AvroDecoder

    decoder = AvroDecoder(
        '{"type": "record", "name": "R", "fields": []}',
        {7: (2, "{}")},
        subject="o-value",
        version=2,
        what="x",
    )
    runs: list[object] = []

    def batch(spark, job, epoch):
        runs.append(job)
        if len(runs) <= len(ids):
            said = decoder.unknown_id_template.format(
                schema_id=ids[len(runs) - 1], bucket=0, offset=5
            )
            raise RuntimeError(
                f"[USER_RAISED_EXCEPTION] \nmodeswitch.errors.UnknownSchemaIdError: {said}\n"
                " SQLSTATE: P0001\n=== Streaming Query ===\n+- Project [CASE WHEN ... raise_error"
                "(concat(\nmodeswitch.errors.UnknownSchemaIdError: , unknown schema id , cast("
                "conv(...))))"
            )

    return runs, batch


def _avro_job(monkeypatch: pytest.MonkeyPatch, on_change: str, registered: dict) -> list:
    """resolve_job and the registry stood in for: what each resolve was given."""
    from types import SimpleNamespace

    from modeswitch.control.payload_settings import SchemaSource

    source = SchemaSource(subject="o-value", on_schema_change=on_change)
    resolved: list = []
    monkeypatch.setattr(
        "modeswitch.modes.job.resolve_job",
        lambda s, k, seen=None: (
            resolved.append(seen)
            or SimpleNamespace(payload=SimpleNamespace(schema_sources={"value": source}))
        ),
    )
    monkeypatch.setattr(
        "modeswitch.sources.schema_registry.find_schema_id",
        lambda schema_id, subject: registered.get(schema_id),
    )
    return resolved


def test_a_job_meeting_unknown_schema_ids_learns_them_and_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeswitch.runners import jobs
    from modeswitch.state import StateStore
    from modeswitch.transforms.schema_ids import SchemaIdsSeen

    settings = PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "s"), "warehouse": str(tmp_path / "w")}
    )
    resolved = _avro_job(monkeypatch, "evolve", {9: (3, "{}")})
    runs, batch = _unknown_ids([8, 9])  # 8 foreign to the subject, 9 its version 3
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    jobs.run("batch", None, settings, epoch=4)
    assert len(runs) == 3
    learned = {"value": SchemaIdsSeen(frozenset({8}))}
    assert resolved == [{}, learned, learned]
    # Each is in the decision log, newest first.
    decisions = StateStore.from_settings(settings).decisions.list()
    assert [(d.decided_by, d.inputs["schema"]["schema_id"]) for d in decisions] == [
        ("schema", 9),
        ("schema", 8),
    ]
    assert decisions[0].reason.startswith("schema id 9 is version 3 of 'o-value'")

    resolved = _avro_job(monkeypatch, "quarantine", {9: (3, "{}")})
    runs, batch = _unknown_ids([9])
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    jobs.run("batch", None, settings, epoch=4)
    assert resolved == [{}, {"value": SchemaIdsSeen(read_as=2)}]  # reads on as version 2

    resolved = _avro_job(monkeypatch, "evolve", {})
    runs, batch = _unknown_ids(list(range(100, 100 + jobs.SCHEMA_ATTEMPTS)))
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    with pytest.raises(RuntimeError, match="unknown schema id 107"):
        jobs.run("batch", None, settings, epoch=4)
    assert len(runs) == jobs.SCHEMA_ATTEMPTS

    _avro_job(monkeypatch, "fail", {9: (3, "{}")})
    runs, batch = _unknown_ids([9])
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    with pytest.raises(ModeswitchError, match=r"version 3 of 'o-value'.*on_schema_change = fail"):
        jobs.run("batch", None, settings, epoch=4)
    assert len(runs) == 1


def test_a_modeswitch_error_is_found_in_a_python_workers_and_in_sparks_text() -> None:
    from modeswitch.errors import FencedError, UnknownSchemaIdError
    from modeswitch.runners.jobs import modeswitch_errors

    worker = RuntimeError(
        "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
        '  File "avro.py", line 1, in decode\n'
        "modeswitch.errors.UnknownSchemaIdError: unknown schema id 3 in a value\n"
    )
    wrapped = ModeswitchError("stream epoch 3: the query failed")
    wrapped.__cause__ = worker
    assert modeswitch_errors(wrapped, UnknownSchemaIdError) == ["unknown schema id 3 in a value"]
    assert modeswitch_errors(UnknownSchemaIdError("raised here"), UnknownSchemaIdError) == [
        "raised here"
    ]
    assert modeswitch_errors(RuntimeError("modeswitch.errors.FencedError: no"), FencedError) == [
        "no"
    ]
    assert (
        modeswitch_errors(RuntimeError("modeswitch.errors.FencedError: no"), UnknownSchemaIdError)
        == []
    )
    assert task_failure(ValueError("x")) is None
