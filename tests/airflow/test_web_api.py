"""The operator's view's JSON API, served by Airflow's own API server app with this repo's
``plugins/`` loaded (``airflow.api_fastapi.app.create_app``, in-process through FastAPI's test
client: no browser), against control tables a real ``decide`` wrote. Users and tokens are the
real simple auth manager's; without a token a route answers 401, for a user the auth manager
does not let read the pipeline DAG 403."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    assert store.commands.list() == []
    queued = http.post(
        "/modeswitch/api/commands", json={"command": "pause", "note": "n"}, headers=token("op")
    )
    assert queued.status_code == 200, queued.text
    (command,) = store.commands.list()
    assert queued.json()["command"] == command.id
    assert (command.kind, command.issuer, command.args) == ("pause", "page user-op", {"note": "n"})
    # Also in Airflow's own Audit Log, under the control DAG: who, when, which command.
    entry = _audit_log_entries()[-1]
    assert (entry.event, entry.owner, entry.dag_id) == (
        "modeswitch_command",
        "user-op",
        "modeswitch_control",
    )
    assert json.loads(entry.extra) == {
        "pipeline": "orders",
        "command": command.id,
        "kind": "pause",
        "args": {"note": "n"},
        "method": "POST",
    }


# -- hostile input --------------------------------------------------------------------------
PIPELINES = ("orders", "refunds")
"""The pipelines of the ``pipeline`` fixture's warehouse."""
FUZZ_EXAMPLES = int(os.environ.get("MODESWITCH_API_FUZZ_EXAMPLES", "120"))
"""Requests per test: bounded, so the fuzz takes seconds; ``make soak-faults`` sends more."""
FUZZ_TIMEOUT = max(600, FUZZ_EXAMPLES // 2)
"""Seconds: 3 000 commands took 457 s here (2026-11-27), beside nothing."""
ANY_TEXT = st.text(max_size=40) | st.sampled_from(["", "../..", "orders", "%00", "1e309", "-1"])
QUERY_VALUE = (
    ANY_TEXT
    | st.integers(-(10**15), 10**15).map(str)
    | st.floats().map(str)
    | st.sampled_from(["lag", "bucket", "2026-01-01T00:00:00Z", "0001-01-01T00:00:00Z"])
    | st.datetimes(timezones=st.just(UTC)).map(lambda at: at.isoformat())
)
JSON_VALUE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
COMMAND_BODY = st.fixed_dictionaries(
    {},
    optional={
        "command": st.sampled_from(["pause", "resume", "rewind", "switch_to_batch", "x", ""])
        | JSON_VALUE,
        "offsets": st.dictionaries(ANY_TEXT, st.integers() | JSON_VALUE, max_size=3) | JSON_VALUE,
        "event_time": st.sampled_from(
            ["2026-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "tomorrow"]
        )
        | JSON_VALUE,
        "note": JSON_VALUE,
        "pipeline": ANY_TEXT | JSON_VALUE,
    },
)

WELL_TYPED_BODY = st.fixed_dictionaries(
    {"command": st.sampled_from(["pause", "resume", "rewind", "switch_to_batch", "backfill"])},
    optional={
        "offsets": st.dictionaries(
            st.sampled_from(["0", "1", "7", "-1", "x"]), st.integers(-5, 10**6), max_size=3
        ),
        "event_time": st.sampled_from(
            ["2026-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "tomorrow"]
        ),
        "note": st.text(max_size=20),
        "pipeline": st.sampled_from(["orders", "refunds", "nope", "../orders"]),
    },
)
"""Bodies of the right types: they reach the command's own checks (the control DAG's)."""


def _refused_properly(response) -> None:
    """Never a server error; every refusal says what is wrong."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        detail = response.json().get("detail")
        assert detail, response.text[:500]


@pytest.mark.timeout(FUZZ_TIMEOUT)
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(["status", "history", "decisions", "pipelines"]),
    params=st.dictionaries(
        st.sampled_from(
            [
                *("pipeline", "rows", "hours", "offset", "limit", "other"),
                *("since", "until", "bucket_order", "bucket_offset", "bucket_limit"),
            ]
        ),
        QUERY_VALUE,
        max_size=4,
    ),
)
def test_hostile_queries_get_a_4xx_with_a_message_never_a_server_error(
    client, pipeline, route: str, params: dict[str, str]
) -> None:
    http, token = client
    with mock.patch.dict(os.environ, _variables(pipeline)):
        response = http.get(f"/modeswitch/api/{route}", params=params, headers=token("viewer"))
    _refused_properly(response)


@pytest.mark.timeout(FUZZ_TIMEOUT)
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=WELL_TYPED_BODY | COMMAND_BODY | JSON_VALUE,
    raw=st.none() | st.none() | st.none() | st.binary(max_size=40),
)
def test_hostile_commands_are_refused_and_queue_nothing(client, pipeline, body, raw) -> None:
    from modeswitch.airflow.settings import settings_from_airflow
    from modeswitch.state import StateStore

    http, token = client
    with mock.patch.dict(os.environ, _variables(pipeline)):
        # Both pipelines of the warehouse: a body may name either.
        stores = [
            StateStore.from_settings(settings_from_airflow({"pipeline": p})) for p in PIPELINES
        ]
        before = sum(len(store.commands.list()) for store in stores)
        if raw is None:
            response = http.post("/modeswitch/api/commands", json=body, headers=token("op"))
        else:  # not JSON at all
            headers = {**token("op"), "Content-Type": "application/json"}
            response = http.post("/modeswitch/api/commands", content=raw, headers=headers)
        after = [c for store in stores for c in store.commands.list()]
    _refused_properly(response)
    if response.status_code != 200:
        assert len(after) == before  # nothing queued from a refused request
    else:
        assert len(after) == before + 1
        assert response.json()["kind"] in ("pause", "resume", "rewind", "switch_to_batch")


@pytest.mark.parametrize(
    ("method", "route", "role", "status"),
    [
        *[("get", r, None, 401) for r in ROUTES],
        *[("get", r, "viewer", 200) for r in ROUTES],
        ("post", "/modeswitch/api/commands", None, 401),
        ("post", "/modeswitch/api/commands", "viewer", 403),
        ("post", "/modeswitch/api/commands", "op", 200),
    ],
)
def test_every_route_asks_for_the_right_user(client, pipeline, method, route, role, status):
    http, token = client
    headers = token(role) if role else {}
    with mock.patch.dict(os.environ, _variables(pipeline)):
        if method == "get":
            response = http.get(route, headers=headers)
        else:
            response = http.post(route, json={"command": "pause"}, headers=headers)
    assert response.status_code == status, response.text[:300]


def _variables(values: dict[str, str]) -> dict[str, str]:
    return {f"AIRFLOW_VAR_MODESWITCH_{k.upper()}": v for k, v in values.items()}


def test_a_cross_site_form_post_cannot_queue_a_command(client, pipeline) -> None:
    """CSRF. The page calls the API with Airflow's session cookie (``_token``: HttpOnly,
    SameSite=Lax, so a browser leaves it off another site's POSTs). A page of another origin
    can still send, without a CORS preflight, only a "simple" request: a form's content types
    or text/plain, never application/json. The command route reads JSON only: such a request
    is refused before anything is queued, even with the cookie."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    from modeswitch.airflow.settings import settings_from_airflow
    from modeswitch.state import StateStore

    http, token = client
    cookie = token("op")["Authorization"].removeprefix("Bearer ")
    body = '{"command": "pause", "note": "from another site"}'
    with mock.patch.dict(os.environ, _variables(pipeline)):
        store = StateStore.from_settings(settings_from_airflow())
        http.cookies.set(COOKIE_NAME_JWT_TOKEN, cookie)
        try:
            for simple in (
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data",
            ):
                sent = http.post(
                    "/modeswitch/api/commands", content=body, headers={"Content-Type": simple}
                )
                assert sent.status_code == 422, (simple, sent.status_code, sent.text[:300])
            assert store.commands.list() == []
            # The page's own same-origin call, with the cookie alone, works.
            same_site = http.post(
                "/modeswitch/api/commands",
                content=body,
                headers={"Content-Type": "application/json"},
            )
            assert same_site.status_code == 200, same_site.text[:300]
        finally:
            http.cookies.clear()
    assert [c.kind for c in store.commands.list()] == ["pause"]


def _audit_log_entries() -> list:
    """The page's commands in Airflow's Audit Log (its ``log`` table), oldest first."""
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = select(Log).where(Log.event == "modeswitch_command").order_by(Log.id)
        return list(session.scalars(query))


def test_another_pipeline_is_read_where_the_warehouse_puts_it(
    client, pipeline, monkeypatch
) -> None:
    """Locations set as Variables are the Variables' pipeline's: another pipeline chosen on
    the page is read from its own tables, not from those."""
    http, token = client
    warehouse = Path(pipeline["warehouse"])
    monkeypatch.setenv("AIRFLOW_VAR_MODESWITCH_STATE_ROOT", str(warehouse / "_modeswitch/orders"))
    monkeypatch.setenv("AIRFLOW_VAR_MODESWITCH_SINK", str(warehouse / "orders"))
    viewer = token("viewer")
    mine = http.get("/modeswitch/api/status?rows=1", headers=viewer).json()
    assert mine["decisions"][0]["decided_by"] == "test"
    other = http.get("/modeswitch/api/status?pipeline=refunds&rows=1", headers=viewer).json()
    assert other["decisions"][0]["decided_by"] == "test-other"
    assert other["sink"] == str(warehouse / "refunds")


def test_the_overview_has_a_row_per_pipeline_and_names_what_tunes_nothing(
    client, pipeline, tmp_path, monkeypatch
) -> None:
    """Pipelines declared by files and those found in the warehouse, one row each; a pipeline
    whose tables cannot be read is a row with its error, the others stand; files that declare
    no pipeline and Variables that tune nothing are named."""
    from modeswitch.airflow.settings import deployment_fleet, settings_from_airflow

    folder = tmp_path / "pipelines"
    folder.mkdir()
    payments_log = SegmentLog.create(str(tmp_path / "payments-log"), buckets=3)
    produce_backlog(payments_log, EventGenerator(seed=2, buckets=3), records=300)
    (folder / "payments.toml").write_text(
        f'source = "{tmp_path}/payments-log"\nwarehouse = "{tmp_path}/fleet"\n'
        'enter_threshold = "3m"\n'
    )
    (folder / "ghost.toml").write_text(f'warehouse = "{tmp_path}/nowhere"\n')  # never ran
    (folder / "broken name.toml").write_text("")
    monkeypatch.setenv("MODESWITCH_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("AIRFLOW_VAR_MODESWITCH_ENTER_TRESHOLD", "1m")
    monkeypatch.setenv("AIRFLOW_VAR_MODESWITCH_PAYMENTS_EXIT_THRESHOLD", "20s")
    fleet = deployment_fleet()
    payments = settings_from_airflow(pipeline=fleet.get("payments"))
    decide(payments, decided_by="test-payments")
    http, token = client
    viewer = token("viewer")

    answer = http.get("/modeswitch/api/overview", headers=viewer).json()
    rows = {row["pipeline"]: row for row in answer["pipelines"]}
    assert list(rows) == ["ghost", "payments", "orders", "refunds"]
    assert rows["payments"]["mode"] == "batch" and rows["payments"]["error"] is None
    assert (rows["payments"]["enter_seconds"], rows["payments"]["exit_seconds"]) == (180, 20)
    assert rows["payments"]["last_decision"]["mode"] == "batch"
    assert rows["orders"]["error"] is None and rows["orders"]["enter_seconds"] == 420
    assert "no epochs or decisions" in rows["ghost"]["error"]
    assert list(answer["refused"]) == [str(folder / "broken name.toml")]
    unknown = {v["key"]: v["problem"] for v in answer["unknown_variables"]}
    assert "did you mean modeswitch_enter_threshold?" in unknown["modeswitch_enter_treshold"]
    assert "modeswitch_payments_exit_threshold" not in unknown

    listed = http.get("/modeswitch/api/pipelines", headers=viewer).json()
    assert listed["declared"] == ["ghost", "payments"]
    assert listed["pipelines"][:2] == ["ghost", "payments"]
    status = http.get("/modeswitch/api/status?pipeline=payments&rows=1", headers=viewer).json()
    assert status["sink"] == str(tmp_path / "fleet" / "payments")
    assert status["settings"]["exit_threshold"]["from"] == (
        "Airflow Variable 'modeswitch_payments_exit_threshold':"
    )
    page = http.get("/modeswitch/", headers=viewer).text
    assert 'data-testid="overview"' in page
