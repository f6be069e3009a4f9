"""The ``modeswitch_delta`` sink's options: what the jobs give (:func:`sink_options`) and what
the sink reads from them, checked on the driver before anything is written
(:class:`DeltaSinkOptions`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from modeswitch.control.settings import PipelineSettings
from modeswitch.offsets import OffsetsMap, offsets_from_json
from modeswitch.storage import absolute_location, storage_options

log = logging.getLogger(__name__)

DEFAULT_MAX_RECORDS_PER_FILE = 5_000_000


# -- options ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeltaSinkOptions:
    """The sink's options, parsed and checked on the driver before anything is written."""

    path: str
    storage_options: dict[str, str] = field(repr=False)
    pipeline: str | None
    epoch: int | None
    mode: str
    sequence: int | None
    offsets_start: OffsetsMap | None
    offsets_end: OffsetsMap | None
    partition_by: tuple[str, ...]
    merge_schema: bool
    max_records_per_file: int
    event_time_column: str
    checkpoint_location: str | None
    quarantine_path: str | None = None
    expected_records: int | None = None
    columns_from: str = ""
    """What the written columns' types come from (``Transform.columns_from``), for errors."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> DeltaSinkOptions:
        """The options of one write. The tables' storage options are this process's
        ``MODESWITCH_STORAGE_OPTIONS`` (:func:`modeswitch.storage.storage_options`: the
        driver's, where the sink commits), overridden key by key by ``storage.<key>``
        options; the jobs give none, since Spark shows a write's options in its plans."""
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise ValueError("option path: the Delta table's URI is required (save(path))")
        pipeline = opts.get("pipeline") or None
        epoch = _int_option(opts, "epoch", minimum=0)
        if pipeline is not None and epoch is None:
            raise ValueError(f"option epoch: required with option pipeline={pipeline!r}")
        if pipeline is None and epoch is not None:
            raise ValueError("option pipeline: required with option epoch")
        mode = opts.get("mode", "batch").lower()
        if mode not in ("batch", "stream"):
            raise ValueError(f"option mode={mode!r}: expected 'batch' or 'stream'")
        merge = opts.get("mergeschema", "false").strip().lower()
        if merge not in ("true", "false"):
            raise ValueError(f"option mergeSchema={merge!r}: expected 'true' or 'false'")
        return cls(
            path=absolute_location(path),
            storage_options={
                **storage_options(),
                **{k[len("storage.") :]: v for k, v in options.items() if _is_storage(k)},
            },
            pipeline=pipeline,
            epoch=epoch,
            mode=mode,
            sequence=_int_option(opts, "sequence", minimum=0),
            offsets_start=_offsets_option(opts, "offsetsStart"),
            offsets_end=_offsets_option(opts, "offsetsEnd"),
            partition_by=tuple(
                c.strip() for c in opts.get("partitionby", "").split(",") if c.strip()
            ),
            merge_schema=merge == "true",
            max_records_per_file=_int_option(opts, "maxRecordsPerFile", minimum=1)
            or DEFAULT_MAX_RECORDS_PER_FILE,
            event_time_column=opts.get("eventtimecolumn", "event_time"),
            checkpoint_location=opts.get("checkpointlocation"),
            expected_records=_int_option(opts, "expectedRecords", minimum=0),
            columns_from=opts.get("columnsfrom", ""),
            quarantine_path=absolute_location(opts["quarantinepath"])
            if opts.get("quarantinepath")
            else None,
        )


def _is_storage(key: str) -> bool:
    return key.lower().startswith("storage.")


def _int_option(opts: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(str(raw).strip())
    except ValueError as exc:
        raise ValueError(f"option {name}={raw!r}: expected a whole number") from exc
    if value < minimum:
        raise ValueError(f"option {name}={raw!r}: must be at least {minimum}")
    return value


def _offsets_option(opts: Mapping[str, str], name: str) -> OffsetsMap | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    return offsets_from_json(raw, source=f"option {name}={raw!r}")


def sink_options(
    settings: PipelineSettings, epoch: int, mode: str, *, columns_from: str = ""
) -> dict[str, str]:
    """The ``modeswitch_delta`` options of epoch ``epoch``'s writes in ``mode`` (``columns_from``:
    what the payload's columns come from, named if one would change type). No storage
    options among them: Spark prints a write's options in its logical plans, unredacted (the
    UI and event log show them with ``spark.sql.ui.explainMode=extended``), so the sink reads
    the credentials from the driver's environment (:meth:`DeltaSinkOptions.parse`)."""
    return {
        "pipeline": settings.pipeline,
        "epoch": str(epoch),
        "mode": mode,
        "quarantinePath": settings.quarantine,
        "columnsFrom": columns_from,
        # A payload whose schema gained fields (a registry's new version, a longer
        # value_schema) adds their columns to the table: on_schema_change = evolve.
        "mergeSchema": str(settings.payload.on_schema_change == "evolve").lower(),
    }
