"""OpenLineage for the epoch tasks: the source as input, the sink and the quarantine as outputs.

Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``) emits a START and a
COMPLETE (or FAIL) event for every task, under the DAG run as its parent run. What a task read
and wrote it learns from the operator: :class:`~modeswitch.airflow.operators.EpochJobOperator`
answers ``get_openlineage_facets_on_complete`` (and ``_on_failure``) with
:func:`epoch_lineage`. The tables are only known once the task has its settings (the settings
come from Variables at run time), so the START event names no datasets.

Datasets are named as OpenLineage's naming conventions have them (and as its Spark listener
names the same tables, so that the two meet in a lineage graph):

================================ ============================== ==========================
location                         namespace                      name
================================ ============================== ==========================
a local folder                   ``file``                       its absolute path
``s3://bucket/path`` (and other  ``s3://bucket``                ``path``
object stores)
``kafka://<topic>``              ``kafka://<first bootstrap      the topic
                                 server>``
================================ ============================== ==========================
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from modeswitch.control.locations import KafkaLocation
from modeswitch.sources import log_type
from modeswitch.storage import is_local, local_path

if TYPE_CHECKING:
    from modeswitch.control.settings import PipelineSettings

log = logging.getLogger(__name__)


def dataset_name(location: str) -> tuple[str, str]:
    """The OpenLineage ``(namespace, name)`` of a table or log at ``location`` (a local path,
    a ``file:`` URI or an object store's URI)."""
    if is_local(location):
        return "file", local_path(location)
    parts = urlsplit(location)
    return f"{parts.scheme}://{parts.netloc}", parts.path.lstrip("/") or "/"


def kafka_dataset_name(source: str, config: dict[str, str] | None) -> tuple[str, str]:
    """The OpenLineage ``(namespace, name)`` of a ``kafka://<topic>`` source: the topic, in the
    namespace of the first of the client configuration's ``bootstrap.servers``."""
    topic = KafkaLocation.parse(source).topic
    servers = (config or {}).get("bootstrap.servers", "")
    first = servers.split(",")[0].strip()
    return (f"kafka://{first}" if first else "kafka"), topic


def epoch_lineage(settings: PipelineSettings, *, kafka_config: dict[str, str] | None = None):
    """The ``OperatorLineage`` of an epoch (or backfill) task of the pipeline ``settings``
    configure: its source as input, its sink and quarantine as outputs. ``kafka_config``: a
    Kafka source's client configuration (only ``bootstrap.servers`` is read)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

    if log_type(settings.source).client_config:
        source = kafka_dataset_name(settings.source, kafka_config)
    else:
        source = dataset_name(settings.source)
    return OperatorLineage(
        inputs=[Dataset(namespace=source[0], name=source[1])],
        outputs=[
            Dataset(namespace=namespace, name=name)
            for namespace, name in (dataset_name(settings.sink), dataset_name(settings.quarantine))
        ],
    )


def task_lineage(settings: PipelineSettings | None) -> Any:
    """:func:`epoch_lineage` for a task that resolved ``settings`` (None: it did not get that
    far, so nothing is known), reading a Kafka source's servers from its Connection. Never
    raises: lineage must not fail a task (the provider logs a failure and emits without)."""
    if settings is None:
        return None
    config = None
    if log_type(settings.source).client_config:
        from modeswitch.airflow.settings import connection_kafka_config

        try:
            config = connection_kafka_config(settings)
        except Exception as exc:  # the task itself says what is wrong with the Connection
            log.warning("lineage: no Kafka servers for %s: %s", settings.source, exc)
    return epoch_lineage(settings, kafka_config=config)


__all__ = ["dataset_name", "epoch_lineage", "kafka_dataset_name", "task_lineage"]
