"""Protobuf schemas as a job carries them: one descriptor set (a serialized
``FileDescriptorSet``, its root file last, every file it imports before it) per schema.

A schema comes as ``.proto`` text or as a serialized ``FileDescriptorProto`` (what Confluent's
serializer registers, base64 in the registry's JSON; a registry returns whichever was
registered), and imports others: the registry's references, Protobuf's well-known types.
:func:`descriptor_set` compiles them all with ``protoc`` (grpcio-tools' own, in a child process
so that its message can go into the error), reading the text files from a scratch folder and
the descriptors as ``--descriptor_set_in``. :func:`schema_file_set` reads a schema file: a
``.proto`` (its imports beside it), or a descriptor set as ``protoc --include_imports
--descriptor_set_out`` writes it.

In the Python workers, :func:`pool_of` makes the descriptors again from the set's bytes, and
:func:`message_at` finds the message a value's message indexes name.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modeswitch.environment import CACHE, env_value
from modeswitch.errors import ConfigError

log = logging.getLogger(__name__)

PROTO_SUFFIX = ".proto"


def _well_known_types() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def registered_file(schema: str) -> str | bytes:
    """A registered schema as :func:`descriptor_set` takes it: the ``FileDescriptorProto``'s
    bytes for a base64 descriptor, the text for ``.proto`` text."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        raw = base64.b64decode(schema, validate=True)
        proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        return schema
    return raw if proto.name else schema


def descriptor_set(files: Mapping[str, str | bytes], root: str, *, what: str) -> bytes:
    """The descriptor set of ``root`` and what it imports, from ``files`` (an import name ->
    ``.proto`` text, or a ``FileDescriptorProto``'s bytes: :func:`registered_file`); the
    well-known types come with the compiler. Raises :class:`ConfigError` naming ``what`` with
    the compiler's message when they do not compile (a syntax error, an import no file is
    given for).

    A set is a function of its files alone, so each one compiled is kept under
    ``$MODESWITCH_CACHE/protobuf``, named by their digest (and the compiler's version): a job
    that starts reads it there, where compiling one costs a child process (0.1-0.2 s a version,
    on every job's start, a stream's at a handoff too)."""
    cached = _cached_set(files, root)
    if cached.is_file():
        return cached.read_bytes()
    content = _compiled_set(files, root, what=what)
    aside = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        aside.write_bytes(content)
        os.replace(aside, cached)  # a concurrent reader never sees half a file
    except OSError as exc:  # a cache that cannot be written: compiled again next time
        log.warning("compiled Protobuf schemas not kept in %s: %s", cached.parent, exc)
        with contextlib.suppress(OSError):
            aside.unlink()
    return content


def _cached_set(files: Mapping[str, str | bytes], root: str) -> Path:
    from grpc_tools import protoc

    digest = hashlib.sha256()
    for part in (getattr(protoc, "__file__", ""), _tools_version(), root):
        digest.update(part.encode() + b"\0")
    for name in sorted(files):
        content = files[name]
        digest.update(name.encode() + b"\0" + (b"b" if isinstance(content, bytes) else b"t"))
        digest.update(content if isinstance(content, bytes) else content.encode())
        digest.update(b"\0")
    return env_value(CACHE) / "protobuf" / f"{digest.hexdigest()[:32]}.binpb"


@functools.cache
def _tools_version() -> str:
    from importlib.metadata import version

    return version("grpcio-tools")


def _compiled_set(files: Mapping[str, str | bytes], root: str, *, what: str) -> bytes:
    from google.protobuf import descriptor_pb2

    with tempfile.TemporaryDirectory(prefix="modeswitch-proto-") as scratch:
        folder = Path(scratch) / "files"
        given = descriptor_pb2.FileDescriptorSet()
        for name, content in files.items():
            if isinstance(content, bytes):
                proto = given.file.add()
                proto.ParseFromString(content)
                proto.name = name
            else:
                path = folder / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
        folder.mkdir(exist_ok=True)
        arguments = [f"-I{folder}", f"-I{_well_known_types()}"]
        if given.file:
            given_path = Path(scratch) / "given.binpb"
            given_path.write_bytes(given.SerializeToString())
            arguments.append(f"--descriptor_set_in={given_path}")
        return _compile(arguments, root, Path(scratch) / "out.binpb", what=what)


def _compile(arguments: Sequence[str], root: str, out: Path, *, what: str) -> bytes:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            *arguments,
            "--include_imports",
            f"--descriptor_set_out={out}",
            root,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        said = " ".join(done.stderr.split()) or f"protoc exited with {done.returncode}"
        for folder in arguments:  # the scratch folder's path says nothing to the reader
            if folder.startswith("-I") and "modeswitch-proto-" in folder:
                said = said.replace(folder[2:] + "/", "")
        raise ConfigError(f"{what}: does not compile as Protobuf: {said}")
    return out.read_bytes()


def schema_file_set(path: str, *, what: str) -> bytes:
    """The descriptor set of the schema file ``path``: a ``.proto`` compiled with the files
    beside it, or a descriptor set as it is. Raises :class:`ConfigError` naming ``what`` for a
    file that cannot be read, does not compile, or is not a descriptor set."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    file = Path(path)
    try:
        content = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what}: cannot be read ({exc.strerror})") from exc
    if file.suffix == PROTO_SUFFIX:
        with tempfile.TemporaryDirectory(prefix="modeswitch-proto-") as scratch:
            arguments = [f"-I{file.parent.resolve()}", f"-I{_well_known_types()}"]
            return _compile(arguments, file.name, Path(scratch) / "out.binpb", what=what)
    try:
        found = descriptor_pb2.FileDescriptorSet.FromString(content)
    except DecodeError as exc:
        raise ConfigError(
            f"{what}: neither a {PROTO_SUFFIX} file nor a descriptor set (protoc "
            "--include_imports --descriptor_set_out)"
        ) from exc
    if not found.file or not found.file[-1].name:
        raise ConfigError(f"{what}: a descriptor set holding no file")
    return content


@functools.lru_cache(maxsize=64)
def pool_of(content: bytes) -> Any:
    """The descriptors of a descriptor set (its bytes), in a pool of their own."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(content).file:
        pool.Add(file)
    return pool


def root_file(content: bytes) -> Any:
    """The root file (the set's last) of a descriptor set, its ``FileDescriptor``."""
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(content).file
    return pool_of(content).FindFileByName(files[-1].name)


def message_at(file: Any, indexes: Sequence[int]) -> Any | None:
    """The message of ``file`` (a ``FileDescriptor``) that message indexes name (``[0]`` the
    first top-level message, ``[1, 0]`` the second's first nested one), or None for none."""
    messages = list(file.message_types_by_name.values())
    found = None
    for index in indexes:
        if not 0 <= index < len(messages):
            return None
        found = messages[index]
        messages = list(found.nested_types)
    return found


def find_message(content: bytes, name: str, *, what: str) -> Any:
    """The message ``name`` (a full name; empty: the root file's first) of a descriptor set.
    Raises :class:`ConfigError` naming ``what`` and the setting when there is none."""
    root = root_file(content)
    if not name:
        first = message_at(root, [0])
        if first is None:
            raise ConfigError(f"{what}: {root.name} declares no message", setting="value_message")
        return first
    try:
        return pool_of(content).FindMessageTypeByName(name)
    except KeyError:
        names = ", ".join(m.full_name for m in root.message_types_by_name.values()) or "none"
        raise ConfigError(
            f"value_message: {name!r} is not a message of {what} (the messages of "
            f"{root.name}: {names}; name one by its full name, package.Message)",
            setting="value_message",
        ) from None


__all__ = [
    "PROTO_SUFFIX",
    "descriptor_set",
    "find_message",
    "message_at",
    "pool_of",
    "registered_file",
    "root_file",
    "schema_file_set",
]
