"""The page's API refuses a bad bucket page or chart range with a 4xx naming the param, before
it reads a setting or a table (the app itself, through FastAPI's test client: no Airflow
server, no user; :func:`~modeswitch.airflow.web.create_app` with its access dependencies
replaced)."""

from __future__ import annotations

import pytest
from fastapi import Depends


@pytest.fixture(scope="module")
def http():
    from fastapi.testclient import TestClient

    from modeswitch.airflow.web import create_app

    def unread() -> list:
        raise AssertionError("a refused request must not read the settings")

    app = create_app(layers=unread, access=Depends(lambda: None), commanding=Depends(lambda: ""))
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize(
    ("query", "status", "named"),
    [
        ("status?bucket_limit=0", 422, "bucket_limit"),
        ("status?bucket_limit=1001", 422, "bucket_limit"),
        ("status?bucket_offset=-1", 422, "bucket_offset"),
        ("status?bucket_order=worst", 422, "bucket_order"),
        ("history?hours=0", 422, "hours"),
        ("history?since=yesterday", 400, "param since: 'yesterday' is not an ISO-8601 time"),
        ("history?until=2026-02-30T00:00:00Z", 400, "param until:"),
        ("history?since=2026-01-01T00:00:00Z&hours=1", 400, "params since and hours"),
        (
            "history?since=2026-01-01T01:00:00Z&until=2026-01-01T00:00:00Z",
            400,
            "param since: '2026-01-01T01:00:00Z' is not before until",
        ),
    ],
)
def test_a_bad_param_is_refused_naming_it(http, query: str, status: int, named: str) -> None:
    response = http.get(f"/api/{query}")
    assert response.status_code == status, response.text
    assert named in response.text
