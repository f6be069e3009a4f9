"""One local Spark session shared by every test of the spark tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from modeswitch.runners.session import create_spark_session

    session = create_spark_session(
        "modeswitch-tests", master="local[2]", conf={"spark.ui.enabled": "false"}
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
