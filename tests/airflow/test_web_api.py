"""The operator's view's JSON API, served by Airflow's own API server app with this repo's
``plugins/`` loaded (``airflow.api_fastapi.app.create_app``, in-process through FastAPI's test
client: no browser), against control tables a real ``decide`` wrote. Users and tokens are the
real simple auth manager's; without a token a route answers 401, for a user the auth manager
does not let read the pipeline DAG 403."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from modeswitch.devtools.produce import EventGenerator, produce_backlog
from modeswitch.runners.lifecycle import decide
from modeswitch.sources.segments import SegmentLog

ROUTES = [
    "/modeswitch/",
    "/modeswitch/api/pipelines",
    "/modeswitch/api/status",
    "/modeswitch/api/history",
    "/modeswitch/api/decisions",
]


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two pipelines' control tables in one warehouse; the Variables configure ``orders``."""
    log = SegmentLog.create(str(tmp_path / "log"), buckets=2)
    produce_backlog(log, EventGenerator(seed=1, buckets=2), records=400)
    values = {
        "pipeline": "orders",
        "source": str(tmp_path / "log"),
        "warehouse": str(tmp_path / "warehouse"),
        "enter_threshold": "7m",
    }
    variables = {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in values.items()}
    with mock.patch.dict(os.environ, variables):
        from modeswitch.airflow.settings import settings_from_airflow

        settings = settings_from_airflow()
        decide(settings, decided_by="test")
        other = settings_from_airflow({"pipeline": "refunds"})
        decide(other, decided_by="test-other")
        yield values


@pytest.fixture(scope="module")
def client(airflow_db: Path):
    """Airflow's API server app with the repo's plugins (the folder conftest configures), and
    a token maker."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    app = create_app()
    manager = get_auth_manager()

    def token(role: str | None) -> dict[str, str]:
        user = SimpleAuthManagerUser(username=f"user-{role}", role=role)
        return {"Authorization": f"Bearer {manager.generate_jwt(user)}"}

    with TestClient(app) as test_client:
        yield test_client, token


def test_the_plugin_mounts_the_app_and_every_route_needs_a_user(client, pipeline) -> None:
    http, token = client
    for route in ROUTES:
        assert http.get(route).status_code == 401, route
        # No role: the auth manager does not let this user read the pipeline DAG.
        assert http.get(route, headers=token(None)).status_code == 403, route
        assert http.get(route, headers=token("viewer")).status_code == 200, route


def test_the_api_answers_what_the_control_tables_hold(client, pipeline) -> None:
    http, token = client
    viewer = token("viewer")
    listed = http.get("/modeswitch/api/pipelines", headers=viewer).json()
    assert listed["default"] == "orders" and listed["pipelines"] == ["orders", "refunds"]

    status = http.get("/modeswitch/api/status", headers=viewer).json()
    assert status["pipeline"] == "orders" and status["mode"]["mode"] == "batch"
    assert status["mode"]["decided_by"] == "test"
    assert [b["bucket"] for b in status["buckets"]] == [0, 1]
    assert sum(b["latest"] for b in status["buckets"]) == 400
    assert status["settings"]["enter_threshold"] == {
        "value": "420s",
        "from": "Airflow Variable 'modeswitch_enter_threshold':",
    }

    other = http.get("/modeswitch/api/status?pipeline=refunds&rows=1", headers=viewer).json()
    assert other["pipeline"] == "refunds" and other["decisions"][0]["decided_by"] == "test-other"

    page = http.get("/modeswitch/api/decisions?limit=1&offset=0", headers=viewer).json()
    assert (page["total"], len(page["decisions"])) == (1, 1)
    assert page["decisions"][0]["decided_by"] == "test"


def test_bad_requests_are_refused_with_what_is_wrong(client, pipeline) -> None:
    http, token = client
    viewer = token("viewer")
    missing = http.get("/modeswitch/api/status?pipeline=nope", headers=viewer)
    assert missing.status_code == 404 and "'nope': no control tables" in missing.json()["detail"]
    assert http.get("/modeswitch/api/status?rows=0", headers=viewer).status_code == 422
    with mock.patch.dict(os.environ, {"AIRFLOW_VAR_MODESWITCH_ENTER_THRESHOLD": "-5m"}):
        bad = http.get("/modeswitch/api/status", headers=viewer)
    assert bad.status_code == 400
    assert "modeswitch_enter_threshold" in bad.json()["detail"]


def test_history_gives_the_charts_points_and_bands(client, pipeline) -> None:
    http, token = client
    history = http.get("/modeswitch/api/history?hours=1", headers=token("viewer")).json()
    (point,) = history["points"]
    assert point["decided_by"] == "test" and point["switched"] and point["mode"] == "batch"
    assert point["offset_lag"] == 400  # nothing committed yet
    assert [e["mode"] for e in history["epochs"]] == ["batch"]
    assert history["thresholds"]["enter_seconds"] == 420


def test_commands_go_through_the_control_dags_checks(client, pipeline) -> None:
    from modeswitch.airflow.settings import settings_from_airflow
    from modeswitch.state import StateStore

    http, token = client
    rewind = {"command": "rewind", "offsets": {"7": 3}, "note": "why not"}
    assert http.post("/modeswitch/api/commands", json=rewind).status_code == 401
    # A viewer may read the pipeline, not trigger the control DAG.
    assert (
        http.post("/modeswitch/api/commands", json=rewind, headers=token("viewer")).status_code
        == 403
    )
    refused = http.post("/modeswitch/api/commands", json=rewind, headers=token("op"))
    assert refused.status_code == 400
    assert refused.json()["detail"] == "param offsets: unknown bucket(s) [7]; the log has [0, 1]"
    with mock.patch.dict(
        os.environ, {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in pipeline.items()}
    ):
        store = StateStore.from_settings(settings_from_airflow())
    assert store.commands() == []
    queued = http.post(
        "/modeswitch/api/commands", json={"command": "pause", "note": "n"}, headers=token("op")
    )
    assert queued.status_code == 200, queued.text
    (command,) = store.commands()
    assert queued.json()["command"] == command.id
    assert (command.kind, command.issuer, command.args) == ("pause", "page user-op", {"note": "n"})
