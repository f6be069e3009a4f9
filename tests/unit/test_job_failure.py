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


def _changing(times: int) -> tuple[list[int], object]:
    """A batch job's run that meets a new schema version ``times`` times, then succeeds."""
    from modeswitch.errors import SchemaChangedError

    runs: list[int] = []

    def batch(spark, job, epoch):
        runs.append(epoch)
        if len(runs) <= times:
            raise SchemaChangedError(f"subject 's': version {len(runs) + 1} registered")

    return runs, batch


def test_a_job_whose_schema_changes_is_resolved_and_run_again_under_evolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeswitch.runners import jobs

    settings = PipelineSettings.from_mapping({"pipeline": "p", "source": str(tmp_path / "s")})
    resolved: list[str] = []
    real = __import__("modeswitch.modes.job", fromlist=["resolve_job"]).resolve_job
    monkeypatch.setattr(
        "modeswitch.modes.job.resolve_job", lambda s, k: resolved.append(k) or real(s, k)
    )
    runs, batch = _changing(2)
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    jobs.run("batch", None, settings, epoch=4)
    assert runs == [4, 4, 4] and resolved == ["batch"] * 3  # resolved anew each time

    runs, batch = _changing(jobs.SCHEMA_ATTEMPTS)
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    with pytest.raises(ModeswitchError, match="version"):
        jobs.run("batch", None, settings, epoch=4)
    assert len(runs) == jobs.SCHEMA_ATTEMPTS

    failing = PipelineSettings.from_mapping(
        {"pipeline": "p", "source": str(tmp_path / "s"), "on_schema_change": "fail"}
    )
    runs, batch = _changing(1)
    monkeypatch.setitem(jobs.JOB_RUNS, "batch", batch)
    with pytest.raises(ModeswitchError, match="version 2 registered"):
        jobs.run("batch", None, failing, epoch=4)
    assert runs == [4]


def test_a_schema_change_raised_in_a_python_worker_is_found_in_sparks_error() -> None:
    from modeswitch.runners.jobs import schema_change

    worker = RuntimeError(
        "An exception was thrown from the Python worker.\nTraceback (most recent call last):\n"
        '  File "avro.py", line 1, in decode\n'
        "modeswitch.errors.SchemaChangedError: subject 'o-value': version 3 registered\n"
    )
    wrapped = ModeswitchError("stream epoch 3: the query failed")
    wrapped.__cause__ = worker
    assert schema_change(wrapped) == "subject 'o-value': version 3 registered"
    assert schema_change(RuntimeError("modeswitch.errors.FencedError: no")) is None
    assert task_failure(ValueError("x")) is None
