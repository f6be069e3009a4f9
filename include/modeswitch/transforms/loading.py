"""The ``transform`` setting resolved to a :class:`~modeswitch.transforms.contract.Transform`.

:func:`payload_transform` builds the transform of a
:class:`~modeswitch.control.value_schema.Payload` (the three settings, read once): for
``value_schema`` the transform built from its fields (:mod:`modeswitch.transforms.payload`), for
``module:function`` the function or :class:`Transform` it names. :func:`load_transform` does
the same from the settings' text.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING

from modeswitch.control.settings import PipelineSettings
from modeswitch.control.value_schema import Payload, describe_payload
from modeswitch.errors import ConfigError
from modeswitch.transforms.contract import DEFAULT_TRANSFORM, Transform
from modeswitch.transforms.keys import check_key_names, with_key
from modeswitch.transforms.payload import schema_transform

if TYPE_CHECKING:
    from modeswitch.transforms.schema_ids import SeenByColumn

log = logging.getLogger(__name__)

BINARY_DECODERS = {
    "avro": "modeswitch.transforms.avro",
    "protobuf": "modeswitch.transforms.protobuf",
}
"""The module of each binary format's decoder: its ``binary_decoder(source, seen)`` reads the
schemas now, its ``transform_of(decoder)`` is the transform that runs it. Imported only for
such a payload (they import pyarrow)."""


def _schema_transform(payload: Payload, seen: SeenByColumn) -> Transform:
    """The transform built from the payload settings: the value's (its fields' parse, or its
    decoder), then the key's decoder where ``key_format`` is binary, their columns checked
    apart."""
    modules = {
        column: importlib.import_module(BINARY_DECODERS[source.format])
        for column, source in payload.schema_sources.items()
    }
    decoders = {
        column: module.binary_decoder(payload.schema_sources[column], seen.get(column))
        for column, module in modules.items()
    }
    value = decoders.get("value")
    transform = (
        schema_transform(payload.fields, event_time=payload.event_time)
        if value is None
        else modules["value"].transform_of(value)
    )
    key = decoders.get("key")
    if key is None:
        return transform
    value_names = [f.name for f in payload.fields] if value is None else value.names
    check_key_names(key.names, value_names, what=transform.columns_from or "the value")
    return with_key(transform, modules["key"].transform_of(key))


MOVED_MODULES = {"modeswitch.arrow_parse": "modeswitch.transforms.arrow"}
"""Modules a ``transform`` setting may still name from before the package's subpackages."""


def load_transform(
    spec: str = DEFAULT_TRANSFORM, *, value_schema: str = "", event_time_field: str = ""
) -> Transform:
    """Resolve the ``transform`` setting (with ``value_schema`` and ``event_time_field``) to a
    :class:`Transform`: :func:`payload_transform` of
    :func:`~modeswitch.control.value_schema.describe_payload`, which refuses, naming the
    setting, what the three settings cannot mean together."""
    return payload_transform(describe_payload(spec, value_schema, event_time_field))


def pipeline_transform(settings: PipelineSettings) -> Transform:
    """The pipeline's transform: :func:`payload_transform` of its payload settings
    (:meth:`~modeswitch.control.settings.PipelineSettings.describe_payload`)."""
    return payload_transform(settings.describe_payload())


def payload_transform(payload: Payload, seen: SeenByColumn | None = None) -> Transform:
    """The transform ``payload`` describes.

    ``value_schema`` (:data:`~modeswitch.transforms.contract.DEFAULT_TRANSFORM`) is the
    transform built from the payload's fields
    (:func:`modeswitch.transforms.payload.schema_transform`), or for an Avro or Protobuf
    payload its decoder, whose schemas are read now (:data:`BINARY_DECODERS`, with what the
    job's earlier runs learned of its schema ids, ``seen``, by column); with a binary
    ``key_format``, followed by the key's decoder (:func:`~modeswitch.transforms.keys.with_key`).
    Any other spec is ``module:function``; ``function`` may be a dotted path inside the module
    (``pkg.mod:Parsers.orders``). A :class:`Transform` is used as is; a plain function becomes
    a Transform named ``spec`` with no Arrow form. A module that moved (:data:`MOVED_MODULES`)
    is found at its new place. Raises :class:`ConfigError` naming the setting and the value
    when the spec is malformed, the module cannot be imported, the attribute is missing, is
    not callable, or is a function carrying an ``arrow_form`` attribute (the Arrow form's old
    place, no longer read: build a :class:`Transform` with ``arrow=`` instead).
    """
    spec = payload.transform
    if payload.from_schema:
        return _schema_transform(payload, seen or {})
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(
            f"transform={spec!r}: expected {DEFAULT_TRANSFORM!r} or 'module:function'"
        )
    module_name, _, attr_path = (part.strip() for part in spec.partition(":"))
    module_name = MOVED_MODULES.get(module_name, module_name)
    if not module_name or not attr_path:
        raise ConfigError(f"transform={spec!r}: expected 'module:function'")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"transform={spec!r}: module {module_name!r} cannot be imported ({exc})"
        ) from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError as exc:
            raise ConfigError(
                f"transform={spec!r}: module {module_name!r} has no attribute {attr_path!r}"
            ) from exc
    if isinstance(target, Transform):
        log.info("transform %s loaded (%s)", spec, target.name)
        return target
    if not callable(target):
        raise ConfigError(
            f"transform={spec!r}: {attr_path!r} is a {type(target).__name__}, not a callable"
        )
    if hasattr(target, "arrow_form"):
        raise ConfigError(
            f"transform={spec!r}: {attr_path!r} carries an arrow_form attribute, which is no "
            "longer read; make it a modeswitch.transforms.Transform(name, spark=..., "
            "arrow=...) to keep its Arrow form"
        )
    log.info("transform %s loaded (a Spark form only)", spec)
    return Transform(name=spec, spark=target)  # type: ignore[arg-type]


__all__ = [
    "BINARY_DECODERS",
    "MOVED_MODULES",
    "load_transform",
    "payload_transform",
    "pipeline_transform",
]
