"""The modeswitch plugin: the operator's view (``modeswitch.airflow.web``) mounted at
``/modeswitch`` in Airflow's API server, and its page in the UI's navigation.

The page is an ``external_views`` entry, not a ``react_apps`` one: it is one HTML file that the
app serves (tables, an SVG chart, plain script), shown by Airflow's UI in a frame, so nothing
needs building on install; a React app would need a JavaScript bundle built for Airflow's
plugin interface.

Airflow does not put a plugin's FastAPI app behind its authentication: every route of the app
requires a user allowed to read the ``modeswitch_pipeline`` DAG (see the app's module).

Every Airflow process imports its plugins, task runners included; the app (and the API
server's modules it needs: ~1.5 s to import) is built only when the API server asks for it.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin


class _BuiltWhenAsked:
    """A class attribute whose value ``build()`` makes on first access."""

    def __init__(self, build: Any) -> None:
        self.build, self.value = build, None

    def __get__(self, instance: object, owner: type) -> Any:
        if self.value is None:
            self.value = self.build()
        return self.value


def _apps() -> list[dict[str, Any]]:
    from modeswitch.airflow.web import create_app

    return [{"app": create_app(), "url_prefix": "/modeswitch", "name": "modeswitch"}]


class ModeswitchPlugin(AirflowPlugin):
    name = "modeswitch"
    fastapi_apps = _BuiltWhenAsked(_apps)
    external_views = [
        {
            "name": "Modeswitch",
            "href": "/modeswitch/",
            "destination": "nav",
            "url_route": "modeswitch",
        }
    ]
