"""The operator's view in Airflow: a FastAPI app that ``plugins/modeswitch_plugin.py`` mounts
at ``/modeswitch`` in Airflow's API server.

The page (``/modeswitch/``, ``page.html`` beside this module) and the JSON API it is built on
(documented in docs/OPERATIONS.md):

- ``GET /modeswitch/api/pipelines``: the pipelines the deployment declares (its pipelines
  folder: :mod:`modeswitch.control.pipelines`) and those whose control tables are in the
  warehouse, the one the Airflow Variables configure (``default``), the files that declare no
  pipeline and the Variables under ``modeswitch_`` that tune nothing;
- ``GET /modeswitch/api/overview``: one row per pipeline (:mod:`modeswitch.ops.overview`), what
  the page opens on;
- ``GET /modeswitch/api/status?pipeline=&rows=&bucket_order=&bucket_offset=&bucket_limit=``:
  one pipeline's status (:func:`~modeswitch.ops.status.pipeline_status`; default: the
  Variables' pipeline, all its buckets by number);
- ``GET /modeswitch/api/history?pipeline=&hours=`` or ``?since=&until=``: the chart's data
  (:func:`~modeswitch.ops.status.pipeline_history`; the range:
  :func:`~modeswitch.ops.status.history_range`);
- ``GET /modeswitch/api/decisions?pipeline=&offset=&limit=``: decisions, newest first, paged;
- ``POST /modeswitch/api/commands``: queue a command through the ``modeswitch_control`` DAG's
  own task function (:func:`~modeswitch.airflow.tasks.submit_control_command`).

Airflow does not put a plugin's FastAPI app behind its authentication, so every route here
depends on :func:`read_access`: an authenticated user (JWT bearer token or Airflow's session
cookie: 401 without one) whom the auth manager allows to read the ``modeswitch_pipeline`` DAG
(403 otherwise); commands also on :func:`command_access` (leave to trigger the control DAG).
Settings come from the Airflow Variables as the pipeline's tasks read them, with the same
Connections for storage and Kafka credentials.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse
from pydantic import BaseModel

from modeswitch.control.pipelines import Fleet, Pipeline
from modeswitch.control.settings import DERIVED_LOCATIONS, PipelineSettings
from modeswitch.control.settings_layers import layer_settings, setting_origins
from modeswitch.errors import ConfigError, ModeswitchError

log = logging.getLogger(__name__)

PIPELINE_DAG_ID = "modeswitch_pipeline"
"""The DAG whose read permission the operator's view requires."""

Layers = list[tuple[str, Any]]


MAX_BUCKET_LIMIT = 1000
"""The most buckets one status answer pages (without ``bucket_limit``: all of them)."""


def _without_locations(layer: Any) -> Any:
    """A settings layer without :data:`DERIVED_LOCATIONS` (a mapping's keys; other layers
    as they are)."""
    if not isinstance(layer, Mapping):
        return layer
    return {key: value for key, value in layer.items() if key not in DERIVED_LOCATIONS}


CONTROL_DAG_ID = "modeswitch_control"
"""The DAG whose runs queue commands; the page's actions require leave to trigger it."""


def read_access() -> Any:
    """Airflow's own dependency: an authenticated user allowed to read the pipeline DAG."""
    return Depends(requires_access_dag("GET", param_dag_id=PIPELINE_DAG_ID))


def command_access() -> Any:
    """Airflow's own dependency: a user allowed to trigger runs of the control DAG (what
    queueing a command through it takes); the user, for the command's issuer."""
    check = requires_access_dag("POST", DagAccessEntity.RUN, param_dag_id=CONTROL_DAG_ID)

    def allowed(request: Request, user: GetUserDep) -> str:
        check(request, user)
        return str(user.get_name())

    return Depends(allowed)


def airflow_layers(pipeline: Pipeline | None = None) -> Layers:
    """The settings layers of ``pipeline``'s tasks (``modeswitch``'s by default): defaults <
    config file < Variables (< the pipeline's file < its own Variables)."""
    from modeswitch.airflow.settings import airflow_setting_layers

    return airflow_setting_layers(pipeline=pipeline)


def airflow_fleet() -> Fleet:
    """The deployment's pipelines, from the pipelines folder beside Airflow's DAG files."""
    from modeswitch.airflow.settings import deployment_fleet

    return deployment_fleet()


def airflow_unknown_variables(fleet: Fleet) -> list[dict[str, str]]:
    """The Variables under ``modeswitch_`` that tune nothing, read from Airflow's database."""
    from modeswitch.airflow.settings import unknown_variables

    return [{"key": t.key, "problem": t.problem} for t in unknown_variables(fleet)]


def list_pipelines(warehouse: str) -> list[str]:
    """The pipelines with control tables under ``<warehouse>/_modeswitch``."""
    import pyarrow.fs as pafs

    from modeswitch.storage import filesystem

    fs, path = filesystem(f"{warehouse}/_modeswitch")
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as exc:
        raise ModeswitchError(f"warehouse {warehouse}: cannot list its pipelines ({exc})") from exc
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def create_app(
    *,
    layers: Callable[..., Layers] = airflow_layers,
    fleet: Callable[[], Fleet] = airflow_fleet,
    unknown_variables: Callable[[Fleet], list[dict[str, str]]] = airflow_unknown_variables,
    access: Any = None,
    commanding: Any = None,
    credentials: Callable[[PipelineSettings], contextlib.AbstractContextManager] | None = None,
) -> FastAPI:
    """The app. ``layers(pipeline)`` gives a declared pipeline's settings layers, ``layers()``
    those of ``modeswitch`` (Airflow's by default); ``fleet()`` the deployment's pipelines and
    ``unknown_variables(fleet)`` the Variables that tune nothing; ``access`` is the
    dependency every route requires (Airflow's :func:`read_access` by default), and
    ``commanding`` the one commands require on top (:func:`command_access`: it gives the
    user's name);
    ``credentials(settings)`` returns the context in which the source and tables are opened
    with their Connections' credentials (:func:`in_airflow_credentials` by default)."""
    app = FastAPI(
        title="modeswitch",
        description="The operator's view of modeswitch pipelines.",
        dependencies=[access if access is not None else read_access()],
    )
    enter = credentials or in_airflow_credentials

    def settings_of(pipeline: str | None) -> tuple[PipelineSettings, dict[str, str]]:
        """The settings of ``pipeline`` (default: the layers'); a bad setting is a ConfigError,
        which :func:`_answer` turns into a 400."""
        declared = {p.name: p for p in fleet().pipelines if p.declared}
        if pipeline in declared:
            chosen = layers(declared[pipeline])
            return layer_settings(*chosen), setting_origins(*chosen)
        chosen = layers()
        settings = layer_settings(*chosen)
        if pipeline and pipeline != settings.pipeline:
            if pipeline not in list_pipelines(settings.warehouse):
                raise HTTPException(
                    404, f"pipeline {pipeline!r}: no control tables in {settings.warehouse}"
                )
            # Another pipeline's tables are where the warehouse puts them: locations set for
            # the Variables' own pipeline (its sink, state root, ...) are not this one's.
            chosen = [
                *((origin, _without_locations(layer)) for origin, layer in chosen),
                ("page:", {"pipeline": pipeline}),
            ]
            settings = layer_settings(*chosen)
        return settings, setting_origins(*chosen)

    @app.get("/api/pipelines")
    async def pipelines() -> dict[str, Any]:
        def read() -> dict[str, Any]:
            settings, _ = settings_of(None)
            deployment = fleet()
            declared = [p.name for p in deployment.pipelines if p.declared]
            found = list_pipelines(settings.warehouse)
            return {
                "default": settings.pipeline,
                "warehouse": settings.warehouse,
                "pipelines": declared + [n for n in found if n not in declared],
                "declared": declared,
                "refused": dict(deployment.refused),
                "unknown_variables": _listed(unknown_variables, deployment),
            }

        return await run_in_threadpool(_answer, read)

    @app.get("/api/overview")
    async def overview() -> dict[str, Any]:
        from modeswitch.ops.overview import fleet_overview
        from modeswitch.ops.status import pipeline_status

        def reader(name: str) -> Callable[[], dict[str, Any]]:
            def read() -> dict[str, Any]:
                settings, _ = settings_of(name)
                with enter(settings) as storage_options:
                    return pipeline_status(settings, rows=20, storage_options=storage_options)

            return read

        def read() -> dict[str, Any]:
            deployment = fleet()
            settings, _ = settings_of(None)
            declared = [p.name for p in deployment.pipelines if p.declared]
            found = [n for n in list_pipelines(settings.warehouse) if n not in declared]
            return {
                "pipelines": fleet_overview((n, reader(n)) for n in declared + found),
                "refused": dict(deployment.refused),
                "unknown_variables": _listed(unknown_variables, deployment),
            }

        return await run_in_threadpool(_answer, read)

    @app.get("/api/status")
    async def status(
        pipeline: str | None = None,
        rows: int = Query(20, ge=1, le=500),
        bucket_order: Literal["bucket", "lag"] = "bucket",
        bucket_offset: int = Query(0, ge=0),
        bucket_limit: int | None = Query(None, ge=1, le=MAX_BUCKET_LIMIT),
    ) -> dict[str, Any]:
        from modeswitch.ops.status import pipeline_status

        def read() -> dict[str, Any]:
            settings, origins = settings_of(pipeline)
            with enter(settings) as storage_options:
                return pipeline_status(
                    settings,
                    origins=origins,
                    rows=rows,
                    storage_options=storage_options,
                    bucket_order=bucket_order,
                    bucket_offset=bucket_offset,
                    bucket_limit=bucket_limit,
                )

        return await run_in_threadpool(_answer, read)

    @app.get("/api/decisions")
    async def decisions(
        pipeline: str | None = None,
        offset: int = Query(0, ge=0),
        limit: int = Query(50, ge=1, le=500),
    ) -> dict[str, Any]:
        from modeswitch.ops.status import decision_summary
        from modeswitch.state import StateStore

        def read() -> dict[str, Any]:
            settings, _ = settings_of(pipeline)
            with enter(settings) as storage_options:
                store = StateStore.from_settings(settings, storage_options=storage_options)
                page = store.decisions.list(limit, offset=offset)
                total = store.decisions.count()
            return {
                "pipeline": settings.pipeline,
                "total": total,
                "offset": offset,
                "limit": limit,
                "decisions": [decision_summary(d) for d in page],
            }

        return await run_in_threadpool(_answer, read)

    @app.get("/api/history")
    async def history(
        pipeline: str | None = None,
        hours: float | None = Query(None, gt=0, le=24 * 31),
        since: str | None = None,
        until: str | None = None,
    ) -> dict[str, Any]:
        import pendulum

        from modeswitch.ops.status import history_range, pipeline_history

        def read() -> dict[str, Any]:
            now = pendulum.now("UTC")
            # Bad params are refused (400) before the settings and tables are read.
            start, end = history_range(now=now, hours=hours, since=since, until=until)
            settings, _ = settings_of(pipeline)
            with enter(settings) as storage_options:
                return pipeline_history(
                    settings, now=now, since=start, until=end, storage_options=storage_options
                )

        return await run_in_threadpool(_answer, read)

    @app.post("/api/commands")
    async def command(
        body: CommandRequest,
        user: str = commanding if commanding is not None else command_access(),
    ) -> dict[str, Any]:
        from modeswitch.airflow.tasks import submit_control_command

        def submit() -> dict[str, Any]:
            params = body.model_dump(exclude={"pipeline"})
            settings, _ = settings_of(body.pipeline)  # an unknown pipeline is refused (404)
            # The control DAG's own task function: the same checks, the same messages; the
            # settings resolved here, so that the Variables are read once per request.
            queued = submit_control_command(params, settings=settings, issuer=f"page {user}")
            audit_command(user, queued)
            return queued

        return await run_in_threadpool(_answer, submit)

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return PAGE.read_text()

    return app


class CommandRequest(BaseModel):
    """A command from the page: the control DAG's params, and which pipeline."""

    command: str
    offsets: dict[str, int] | None = None
    event_time: str | None = None
    note: str = ""
    pipeline: str | None = None


AUDIT_EVENT = "modeswitch_command"
"""The event of a command queued from the page in Airflow's Audit Log."""


def audit_command(user: str, queued: dict[str, Any]) -> None:
    """Record a command queued from the page in Airflow's Audit Log (its ``log`` table: who,
    when, and in ``extra`` the pipeline, the command's id, kind and args), under the control
    DAG, where an operator finds every other action taken in Airflow."""
    import json

    from airflow.models.log import Log
    from airflow.utils.session import create_session

    extra = {
        "pipeline": queued["pipeline"],
        "command": queued["command"],
        "kind": queued["kind"],
        "args": queued["args"],
        "method": "POST",
    }
    with create_session() as session:
        session.add(
            Log(
                event=AUDIT_EVENT,
                owner=user,
                owner_display_name=user,
                dag_id=CONTROL_DAG_ID,
                extra=json.dumps(extra, default=str),
            )
        )


PAGE = Path(__file__).with_name("page.html")
"""The page: one HTML file with its script and styles; no build step."""


def _listed(report: Callable[[Fleet], list[dict[str, str]]], fleet: Fleet) -> Any:
    """The report, or what kept it from being made (a report never fails the answer)."""
    try:
        return report(fleet)
    except Exception as exc:
        log.warning("could not list the modeswitch_* Variables: %s", exc)
        return [{"key": "", "problem": f"could not be listed: {type(exc).__name__}: {exc}"}]


def _answer(read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``read()``, with the package's errors as HTTP errors that carry their message."""
    try:
        return read()
    except HTTPException:
        raise
    except ConfigError as exc:
        raise HTTPException(400, str(exc)) from exc
    except ModeswitchError as exc:
        raise HTTPException(404, str(exc)) from exc


@contextlib.contextmanager
def in_airflow_credentials(settings: PipelineSettings) -> Iterator[dict[str, str]]:
    """The block in which a pipeline's source and tables are opened with the credentials of
    its Airflow Connections (``storage_connection``, ``kafka_connection``); yields the
    tables' storage options."""
    from modeswitch.airflow.settings import connection_storage_options, source_credentials

    with source_credentials(settings):
        yield connection_storage_options(settings)


__all__ = ["PIPELINE_DAG_ID", "create_app", "list_pipelines", "read_access"]
