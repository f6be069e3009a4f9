"""Records to table rows and back: offsets maps and arguments as JSON text, times as UTC."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from modeswitch.offsets import offsets_from_json, offsets_to_json
from modeswitch.state.records import (
    Command,
    Epoch,
    LedgerSplit,
    Progress,
    RecordedDecision,
    as_utc,
    json_or_none,
    offsets_or_none,
)


def epoch_to_row(epoch: Epoch) -> dict[str, Any]:
    """The ``epochs`` row of an epoch."""
    return {
        "id": epoch.id,
        "mode": epoch.mode,
        "reason": epoch.reason,
        "status": epoch.status,
        "started_at": epoch.started_at,
        "start_offsets": offsets_to_json(epoch.start),
        "boundary_offsets": json_or_none(epoch.boundary),
        "ended_at": epoch.ended_at,
        "end_offsets": json_or_none(epoch.end),
        "end_reason": epoch.end_reason,
        "max_event_times": None
        if epoch.max_event_time_us is None
        else json.dumps(
            {str(b): t for b, t in sorted(epoch.max_event_time_us.items())},
            separators=(",", ":"),
        ),
    }


def epoch_from_row(row: Mapping[str, Any]) -> Epoch:
    """The epoch of an ``epochs`` row."""
    source = f"epoch {row['id']}"
    return Epoch(
        id=row["id"],
        mode=row["mode"],
        reason=row["reason"],
        status=row["status"],
        started_at=as_utc(row["started_at"]),
        start=offsets_from_json(row["start_offsets"], source=f"{source} start"),
        boundary=offsets_or_none(row["boundary_offsets"], source=f"{source} boundary"),
        ended_at=as_utc(row["ended_at"]),
        end=offsets_or_none(row["end_offsets"], source=f"{source} end"),
        end_reason=row["end_reason"],
        max_event_time_us=None
        if row.get("max_event_times") is None
        else {int(b): int(t) for b, t in json.loads(row["max_event_times"]).items()},
    )


def split_to_row(split: LedgerSplit) -> dict[str, Any]:
    """The ``splits`` row of a ledger split."""
    return {
        "epoch": split.epoch,
        "wave": split.wave,
        "bucket": split.bucket,
        "start_offset": split.start,
        "end_offset": split.end,
        "status": split.status,
        "recorded_at": split.recorded_at,
        "updated_at": split.updated_at,
    }


def split_from_row(row: Mapping[str, Any]) -> LedgerSplit:
    """The ledger split of a ``splits`` row."""
    return LedgerSplit(
        epoch=row["epoch"],
        wave=row["wave"],
        bucket=row["bucket"],
        start=row["start_offset"],
        end=row["end_offset"],
        status=row["status"],
        recorded_at=as_utc(row["recorded_at"]),
        updated_at=as_utc(row["updated_at"]),
    )


def progress_to_row(progress: Progress) -> dict[str, Any]:
    """The ``progress`` row of a sink commit."""
    return {
        "epoch": progress.epoch,
        "sequence": progress.sequence,
        "mode": progress.mode,
        "start_offsets": offsets_to_json(progress.start),
        "end_offsets": offsets_to_json(progress.end),
        "records": progress.records,
        "max_event_time_us": json.dumps(
            {str(b): t for b, t in sorted(progress.max_event_time_us.items())},
            separators=(",", ":"),
        ),
        "watermark": progress.watermark,
        "committed_at": progress.committed_at,
        "sink_version": progress.sink_version,
        "recorded_at": progress.recorded_at,
        "recorded_by": progress.recorded_by,
        "commits": progress.commits,
        "quarantined": progress.quarantined,
    }


def progress_from_row(row: Mapping[str, Any]) -> Progress:
    """The sink commit of a ``progress`` row."""
    source = f"progress of epoch {row['epoch']} sequence {row['sequence']}"
    return Progress(
        epoch=row["epoch"],
        sequence=row["sequence"],
        mode=row["mode"],
        start=offsets_from_json(row["start_offsets"], source=f"{source} start"),
        end=offsets_from_json(row["end_offsets"], source=f"{source} end"),
        records=row["records"],
        max_event_time_us={int(b): int(t) for b, t in json.loads(row["max_event_time_us"]).items()},
        watermark=as_utc(row["watermark"]),
        committed_at=as_utc(row["committed_at"]),
        sink_version=row["sink_version"],
        recorded_at=as_utc(row["recorded_at"]),
        recorded_by=row["recorded_by"],
        commits=row.get("commits") or 1,
        quarantined=row.get("quarantined") or 0,
    )


def decision_to_row(decision: RecordedDecision) -> dict[str, Any]:
    """The ``decisions`` row of a policy evaluation (``inputs`` must be JSON-safe already)."""
    return {
        "at": decision.at,
        "mode": decision.mode,
        "reason": decision.reason,
        "switched": decision.switched,
        "inputs": json.dumps(decision.inputs, sort_keys=True, separators=(",", ":")),
        "epoch": decision.epoch,
        "decided_by": decision.decided_by,
    }


def decision_from_row(row: Mapping[str, Any]) -> RecordedDecision:
    """The policy evaluation of a ``decisions`` row."""
    return RecordedDecision(
        at=as_utc(row["at"]),
        mode=row["mode"],
        reason=row["reason"],
        switched=row["switched"],
        inputs=json.loads(row["inputs"]),
        epoch=row["epoch"],
        decided_by=row["decided_by"],
    )


def command_to_row(command: Command) -> dict[str, Any]:
    """The ``commands`` row of a command."""
    return {
        "id": command.id,
        "kind": command.kind,
        "args": json.dumps(command.args, sort_keys=True, separators=(",", ":")),
        "issuer": command.issuer,
        "status": command.status,
        "created_at": command.created_at,
        "applied_at": command.applied_at,
        "applied_epoch": command.applied_epoch,
        "applied_offsets": json_or_none(command.applied_offsets),
        "rejected_at": command.rejected_at,
        "reason": command.reason,
    }


def command_from_row(row: Mapping[str, Any]) -> Command:
    """The command of a ``commands`` row."""
    return Command(
        id=row["id"],
        kind=row["kind"],
        args=json.loads(row["args"]),
        issuer=row["issuer"],
        status=row["status"],
        created_at=as_utc(row["created_at"]),
        applied_at=as_utc(row["applied_at"]),
        applied_epoch=row["applied_epoch"],
        applied_offsets=offsets_or_none(
            row["applied_offsets"], source=f"command {row['id']} applied offsets"
        ),
        rejected_at=as_utc(row["rejected_at"]),
        reason=row["reason"],
    )
