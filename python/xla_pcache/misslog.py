"""The miss log: what each miss of a cache was made of, kept in the cache's directory.

The adapters record each miss through ``xla_pcache.explain.record_miss``, which appends it
here (``append_miss``) and reads the log back; the key-part modules put the same format in
entries' metadata. This module imports nothing of the package but the loggers and
``build_key``.

The miss log is ``<root>/misses.log``, JSON lines, at most ``MAX_LOG_BYTES``; when full it
becomes ``misses.log.1`` (replacing the previous one) and a new one starts, so the two hold
the most recent misses and never grow without limit. A read-only process never writes it.

The cache directory may be writable by others, so its files are opened relative to a
directory handle (``O_DIRECTORY|O_NOFOLLOW``), themselves with ``O_NOFOLLOW|O_NONBLOCK``
(a link or a FIFO planted in place of the log is refused, never followed or waited on),
must be regular files, and are read within a bound. Records are checked before use; a
malformed one is skipped.

What a key is made of travels in one format for both frameworks: a JSON object of
``components`` (name, digest, readable value), in entry metadata under ``META_COMPONENTS``
and in the log's records.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import time
from collections.abc import Callable
from typing import Any

from xla_pcache import build_key
from xla_pcache._text import package_logger

logger = package_logger("xla_pcache.explain")

# Entry metadata: the components (JSON) and the compile time the framework measured
# (seconds; the store counts it as saved on every hit, see rust/core/src/stats.rs).
META_COMPONENTS = "key_components"
META_COMPILE_TIME = "compile_time_s"

# The names JAX 0.6-0.12 give the components, in the order it hashes them (0.5 has no
# "backend version"). Only for ordering what explain prints; the recorded names are JAX's.
KNOWN = (
    "computation",
    "jax_lib version",
    "backend version",
    "XLA flags",
    "compile_options",
    "accelerator_config",
    "compression",
    "custom_hook",
)

MISS_LOG = "misses.log"
MISS_LOG_OLD = "misses.log.1"
MAX_LOG_BYTES = 256 * 1024
MAX_RECORD_BYTES = 16 * 1024
MAX_META_CHARS = 32 * 1024  # component metadata larger than this is not ours: ignored
# Records are written by any process with access to the directory: JSON nested deeper than
# this (the recursion limit is the parser's) or a time outside these bounds is not ours.
MAX_JSON_DEPTH = 32
MAX_TIME = 1e11


def bounded_json(text: str, limit: int = MAX_LOG_BYTES) -> Any:
    """``json.loads(text)`` for text of at most ``limit`` characters nested at most
    ``MAX_JSON_DEPTH`` deep (checked before parsing); ValueError otherwise."""
    if len(text) > limit:
        raise ValueError("record too long")
    depth = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError("record nested too deeply")
        elif c in "]}":
            depth -= 1
    return json.loads(text)


def valid_time(t: Any) -> bool:
    # bool is an int; a 400-digit int is one too, and float() of it overflows.
    return isinstance(t, int | float) and not isinstance(t, bool) and -MAX_TIME < t < MAX_TIME


_O_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# A cache's directory: its path, or what gives a new descriptor of it (``Store.root_fd``:
# the directory the store works in, whatever was renamed since).
Root = str | Callable[[], int]


def _open_dir(root: Root) -> int:
    if callable(root):
        try:
            return root()
        except OSError:
            raise
        except Exception as exc:  # the store's CacheError (closed, or its directory gone)
            raise OSError(str(exc)) from exc
    # The configured root may itself be reached through a link (the user's own setting);
    # inside it nothing is followed.
    real = os.path.realpath(root)
    return os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _open_regular(name: str, flags: int, dir_fd: int) -> int | None:
    """Open ``name`` inside the directory; None when it is absent or not a regular file."""
    try:
        fd = os.open(name, flags | _O_SAFE, 0o666, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link planted in its place: never followed
            logger.debug("xla_pcache: %s in the cache is a symbolic link; ignored", name)
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
    except OSError:
        os.close(fd)
        raise
    return fd


def append_miss(root: Root, record: dict[str, Any]) -> bool:
    """Append one record to the miss log of the cache at ``root``; False when it could
    not be written (logged at debug level: the log is a diagnostic, never a failure)."""
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    if len(line) > MAX_RECORD_BYTES:
        record = {k: v for k, v in record.items() if k != "components"}
        record["components_dropped"] = True
        line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
        if len(line) > MAX_RECORD_BYTES:
            return False
    try:
        dfd = _open_dir(root)
    except OSError as exc:
        shown = root if isinstance(root, str) else "the cache's directory"
        logger.debug("xla_pcache: cannot open %s for the miss log: %s", shown, exc)
        return False
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd = _open_regular(MISS_LOG, flags, dfd)
        if fd is None:
            return False
        try:
            if os.fstat(fd).st_size + len(line) > MAX_LOG_BYTES:
                os.close(fd)
                fd = -1
                # Two processes may rotate at once: the second then moves a new, nearly empty
                # log over the first's. A few records lost, the bound kept.
                os.replace(MISS_LOG, MISS_LOG_OLD, src_dir_fd=dfd, dst_dir_fd=dfd)
                fd = _open_regular(MISS_LOG, flags, dfd) or -1
                if fd < 0:
                    return False
            os.write(fd, line)
            return True
        finally:
            if fd >= 0:
                os.close(fd)
    except OSError as exc:
        logger.debug("xla_pcache: cannot append to the miss log in %s: %s", root, exc)
        return False
    finally:
        os.close(dfd)


def _read_tail(dfd: int, name: str) -> list[str]:
    fd = _open_regular(name, os.O_RDONLY, dfd)
    if fd is None:
        return []
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - MAX_LOG_BYTES)
        data = os.pread(fd, size - start, start) if size > start else b""
    finally:
        os.close(fd)
    lines = data.decode("utf-8", "replace").split("\n")
    if start > 0 and lines:
        lines = lines[1:]  # began mid-record
    return [line for line in lines if line.strip()]


def _valid_record(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("key"), str)
        and 0 < len(obj["key"]) <= 4096
        and valid_time(obj.get("t", 0))
        and valid_components(obj.get("components"))
    )


def valid_components(parts: Any) -> bool:
    if parts is None:
        return True
    return isinstance(parts, list) and all(
        isinstance(p, dict) and isinstance(p.get("name"), str) and isinstance(p.get("digest"), str)
        for p in parts
    )


def read_misses(root: Root) -> list[dict[str, Any]]:
    """The recorded misses, oldest first (both log files)."""
    try:
        dfd = _open_dir(root)
    except OSError as exc:
        shown = root if isinstance(root, str) else "the cache's directory"
        raise OSError(f"cannot open {shown}: {exc.strerror or exc}") from exc
    out: list[dict[str, Any]] = []
    try:
        for name in (MISS_LOG_OLD, MISS_LOG):
            for line in _read_tail(dfd, name):
                try:
                    obj = bounded_json(line)
                except ValueError:
                    continue
                if _valid_record(obj):
                    out.append(obj)
    finally:
        os.close(dfd)
    out.sort(key=lambda r: float(r.get("t", 0)))
    return out


def miss_record(key: str, parts: dict[str, Any] | None, framework: str) -> dict[str, Any]:
    record: dict[str, Any] = {
        "key": key,
        "module": parts["module"] if parts else module_name(key),
        "t": round(time.time(), 3),
        "framework": framework,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if parts is not None:
        record["components"] = parts["components"]
        if "verified" in parts:
            record["verified"] = bool(parts["verified"])
    return record


def encode(parts: dict[str, Any]) -> str:
    return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def order(names: set[str]) -> list[str]:
    """Component names in JAX's order; names it may add later follow, sorted."""
    return [n for n in KNOWN if n in names] + sorted(names - set(KNOWN))


def module_name(key: str) -> str:
    """The program's name in a JAX key (``jit_step-<sha256 hex>`` -> ``jit_step``), with or
    without the build the store's key adds."""
    key = build_key.strip(key)
    head, sep, tail = key.rpartition("-")
    return head if sep and tail and all(c in "0123456789abcdef" for c in tail) else key
