"""An epoch job's session registers no Python data source up front (the first registration
costs a Python worker's lookup of installed data sources): each reader and writer that uses
the ``bucketlog`` source or the ``modeswitch_delta`` sink registers it where it uses it, so a
stand-in session that refuses an unregistered format, as Spark does, takes every one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modeswitch.control.settings import PipelineSettings
from modeswitch.modes.job import resolve_job
from modeswitch.modes.stream_query import STREAM_WRITERS, bucketlog_stream
from modeswitch.modes.waves import WaveRead, read_bucketlog
from modeswitch.sinks.native import write_batch


class Chain:
    """Any builder call returns the chain; ``format`` asks the session."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def format(self, name: str) -> Chain:
        if name not in self.session.registered:
            raise LookupError(f"DATA_SOURCE_NOT_FOUND {name}")  # what Spark says
        self.session.used.append(name)
        return self

    def __getattr__(self, _: str) -> Any:
        return lambda *args, **kwargs: self


class Registry:
    def __init__(self, session: Session) -> None:
        self.session = session

    def register(self, source: type) -> None:
        self.session.registered.add(source.name())


class Session:
    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.used: list[str] = []
        self.dataSource = Registry(self)
        self.read = self.readStream = Chain(self)
        self.sparkSession = self  # as a DataFrame's
        self.write = Chain(self)


@pytest.fixture
def job(tmp_path: Path):
    settings = PipelineSettings(source=str(tmp_path / "log"), warehouse=str(tmp_path / "wh"))
    return resolve_job(settings, "batch")


def test_the_bucketlog_readers_register_the_source(job) -> None:
    session = Session()
    read_bucketlog(session, job, WaveRead((((0, 0, 10),),), "/scratch", 1), in_reader=False)
    assert session.used == ["bucketlog"]
    streaming = Session()
    bucketlog_stream(streaming, job.source, "{}", None)
    assert streaming.used == ["bucketlog"]


def test_the_python_writers_register_the_sink(job) -> None:
    session = Session()
    write_batch(session, job.settings.sink, writer="python", pipeline="p")
    assert session.used == ["modeswitch_delta"]
    streaming = Session()
    STREAM_WRITERS["python"](streaming, job, job.source, Chain(streaming), {})
    assert streaming.used == ["modeswitch_delta"]
