"""A directory filled by JAX's own persistent cache (``jax._src.lru_cache.LRUCache``), and
its adoption into a ``Store``.

JAX's file cache keeps each executable in ``<key>-cache``: 4 bytes of compile time (big
endian) and the serialized executable, compressed with zstd when JAX finds
``compression.zstd`` or ``zstandard`` and with zlib otherwise. With a size limit it also
writes ``<key>-atime`` beside it and a ``.lockfile``. Every JAX from 0.4.36 to 0.12 writes
this format; the value in the file is byte for byte what JAX hands the adapter's ``put``,
under the same key, so an entry is adopted as it is: read, checked, published into the
store under its key, then removed from JAX's directory (it is then counted in the store's
budget and kept once).

Everything read from the directory is untrusted: only names of the shape JAX writes
(``<module name>-<64 hex digits>-cache``, no ``/``) are considered; files are opened
relative to the directory without following links and without blocking (a FIFO); what is
not a regular file, larger than the bound, or does not decompress to a whole value in a
format the reader's JAX decompresses is rejected (a miss, left where it is). JAX writes the
file in place without a lock, so a file being written is incomplete and is rejected the same
way.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from xla_pcache._core import Store as _CoreStore
from xla_pcache._text import package_logger

logger = package_logger(__name__)

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
# ``<module name>-<sha256 hex>``; the module name is whatever the program's jitted function
# is called, so only what would make the name unsafe is refused.
_KEY = re.compile(r"[^/\x00]{1,190}-[0-9a-f]{64}")
_NAME_MAX = 255
# Larger entries than this are not read into memory to be checked (JAX's own executables
# are far smaller); the store's budget lowers it further.
MAX_ENTRY_BYTES = 2 << 30
# A value decompressing to more than this many times its size is refused unread to the end.
_MAX_RATIO = 1000
_CHUNK = 1 << 20
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_TIME_BYTES = 4

ZSTD = "zstd"
ZLIB = "zlib"


class Rejected(Exception):
    """A JAX cache file that cannot be adopted; the message says why."""


def key_of(name: str) -> str | None:
    """The key of a ``<key>-cache`` file name, or None for any other name."""
    if not name.endswith(CACHE_SUFFIX) or len(name.encode("utf-8", "replace")) > _NAME_MAX:
        return None
    key = name[: -len(CACHE_SUFFIX)]
    return key if _KEY.fullmatch(key) else None


def valid_key(key: str) -> bool:
    return key_of(key + CACHE_SUFFIX) == key


def _zstd_module() -> Any:
    """A zstd decompressor module as JAX would pick it: ``compression.zstd``, else
    ``zstandard``, else None."""
    try:
        from compression import zstd  # type: ignore[import-not-found, unused-ignore]

        return zstd
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found, unused-ignore]

        return zstandard
    except ImportError:
        return None


def decodable_formats() -> frozenset[str]:
    """The formats this process can check: zlib, and zstd when a zstd module is there."""
    return frozenset({ZLIB, ZSTD} if _zstd_module() is not None else {ZLIB})


def jax_formats(cc: Any) -> frozenset[str]:
    """The one format the running JAX (``jax._src.compilation_cache``) decompresses: zstd
    when it found a zstd module, else zlib. An entry in the other format would fail in JAX,
    so it is not adopted."""
    if getattr(cc, "zstd", None) is not None or getattr(cc, "zstandard", None) is not None:
        return frozenset({ZSTD})
    return frozenset({ZLIB})


def _stream_zlib(data: memoryview, limit: int) -> Iterator[bytes]:
    d = zlib.decompressobj()
    pos = 0
    produced = 0
    while not d.eof:
        if d.unconsumed_tail:
            chunk = d.decompress(d.unconsumed_tail, _CHUNK)
        elif pos < len(data):
            chunk = d.decompress(data[pos : pos + _CHUNK], _CHUNK)
            pos += _CHUNK
        else:
            raise Rejected("zlib stream ends early (truncated, or still being written)")
        produced += len(chunk)
        if produced > limit:
            raise Rejected("decompresses to more than the bound")
        yield chunk
    if d.unused_data or pos < len(data):
        raise Rejected("bytes after the end of the zlib stream")


def _stream_zstd(data: memoryview, limit: int) -> Iterator[bytes]:
    mod = _zstd_module()
    if mod is None:
        raise Rejected("zstd-compressed, and no zstd module to read it")
    if hasattr(mod, "ZstdDecompressor") and hasattr(mod, "get_frame_info"):
        # compression.zstd (Python 3.14)
        d = mod.ZstdDecompressor()
        pos = 0
        produced = 0
        while not d.eof:
            if d.needs_input:
                if pos >= len(data):
                    raise Rejected("zstd frame ends early (truncated, or still being written)")
                piece = bytes(data[pos : pos + _CHUNK])
                pos += _CHUNK
            else:
                piece = b""
            chunk = d.decompress(piece, _CHUNK)
            produced += len(chunk)
            if produced > limit:
                raise Rejected("decompresses to more than the bound")
            yield chunk
        if d.unused_data or pos < len(data):
            raise Rejected("bytes after the end of the zstd frame")
        return
    # zstandard: the frame's declared size bounds the work; a short or corrupt frame raises.
    declared = mod.frame_content_size(bytes(data[:18]))
    if declared is not None and declared > limit:
        raise Rejected("declares more decompressed bytes than the bound")
    d = mod.ZstdDecompressor().decompressobj()
    produced = 0
    for pos in range(0, len(data), _CHUNK):
        chunk = d.decompress(bytes(data[pos : pos + _CHUNK]))
        produced += len(chunk)
        if produced > limit:
            raise Rejected("decompresses to more than the bound")
        yield chunk
        if getattr(d, "eof", False) and pos + _CHUNK < len(data):
            raise Rejected("bytes after the end of the zstd frame")
    if hasattr(d, "eof") and not d.eof:
        raise Rejected("zstd frame ends early (truncated, or still being written)")
    if declared is not None and declared >= 0 and produced != declared:
        raise Rejected("zstd frame ends early (truncated, or still being written)")


def check_value(value: bytes | memoryview, formats: frozenset[str]) -> str:
    """Decompress ``value`` (streaming, nothing kept) as JAX would before deserializing it,
    and check it holds a compile time and an executable. Returns the format; raises
    ``Rejected`` saying why not. The executable itself is only parsed by JAX's backend: if
    that fails, JAX compiles again and its put replaces the adopted entry."""
    data = memoryview(value).cast("B")
    fmt = ZSTD if bytes(data[:4]) == _ZSTD_MAGIC else ZLIB
    if fmt not in formats:
        raise Rejected(f"{fmt}-compressed; this JAX reads {'/'.join(sorted(formats))} only")
    limit = max(len(data), 1) * _MAX_RATIO
    stream = _stream_zstd if fmt == ZSTD else _stream_zlib
    total = 0
    try:
        for chunk in stream(data, limit):
            total += len(chunk)
    except Rejected:
        raise
    except Exception as exc:  # zlib.error, ZstdError, ...: not a value JAX can read
        raise Rejected(f"does not decompress ({fmt}): {exc}") from None
    if total <= _TIME_BYTES:
        raise Rejected("holds no executable")
    return fmt


def compile_time(value: bytes | memoryview) -> float | None:
    """The whole seconds JAX wrote in front of the executable, or None."""
    data = bytes(memoryview(value)[:65536])
    try:
        if data[:4] == _ZSTD_MAGIC:
            head = b"".join(_stream_zstd_head(data))
        else:
            head = zlib.decompressobj().decompress(data, _TIME_BYTES)
    except Exception:
        return None
    return float(int.from_bytes(head[:_TIME_BYTES], "big")) if len(head) >= _TIME_BYTES else None


def _stream_zstd_head(data: bytes) -> Iterator[bytes]:
    mod = _zstd_module()
    if mod is None:
        return
    if hasattr(mod, "get_frame_info"):
        yield mod.ZstdDecompressor().decompress(data, _TIME_BYTES)
    else:
        with mod.ZstdDecompressor().stream_reader(data) as reader:
            yield reader.read(_TIME_BYTES)


@dataclasses.dataclass(frozen=True)
class _Read:
    value: bytes
    # Which file it was: an inode number alone may be reused by a file written since.
    ident: tuple[int, int, int, int]


def _ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class JaxCacheDir:
    """JAX's cache directory at ``path``: read and remove its entries, never anything else.

    Every operation opens the directory afresh and works relative to it.
    """

    def __init__(self, path: str | os.PathLike[str], *, key_path: str | None = None) -> None:
        self.path = os.path.abspath(os.fspath(path))
        # The directory as JAX was given it: on jax < 0.11 it is part of JAX's own keys.
        self.key_path = key_path if key_path is not None else self.path

    def __repr__(self) -> str:
        return f"JaxCacheDir({self.path!r})"

    def _dir_fd(self) -> int:
        return os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def has_entries(self) -> bool:
        """Whether the directory holds at least one file named as JAX names its entries
        (stops at the first; False when it cannot be listed)."""
        try:
            with os.scandir(self.path) as it:
                return any(key_of(e.name) is not None for e in it)
        except OSError:
            return False

    def keys(self) -> Iterator[str]:
        """The keys of the ``<key>-cache`` names in the directory (not yet checked)."""
        with os.scandir(self.path) as it:
            for e in it:
                key = key_of(e.name)
                if key is not None:
                    yield key

    def read(self, key: str, max_bytes: int = MAX_ENTRY_BYTES) -> _Read | None:
        """The bytes of ``<key>-cache``; None when there is no such file. Raises
        ``Rejected`` for a link, a FIFO, a directory, a file over ``max_bytes`` or one that
        changes size while read; ``OSError`` when the directory cannot be opened."""
        if not valid_key(key):
            raise Rejected("not a name JAX writes")
        dfd = self._dir_fd()
        try:
            try:
                # Never open what is not a regular file: a device's open may act, a FIFO's
                # may block. The fstat below checks the opened file is still that one.
                if not stat.S_ISREG(
                    os.stat(key + CACHE_SUFFIX, dir_fd=dfd, follow_symlinks=False).st_mode
                ):
                    raise Rejected("not a regular file")
                fd = os.open(
                    key + CACHE_SUFFIX,
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=dfd,
                )
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EMLINK):
                    raise Rejected("a symbolic link") from None
                if exc.errno in (errno.ENXIO, errno.EISDIR):
                    raise Rejected("not a regular file") from None
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise Rejected("not a regular file")
                if st.st_size > max_bytes:
                    raise Rejected(f"larger than {max_bytes} bytes")
                buf = bytearray(st.st_size + 1)
                view = memoryview(buf)
                got = 0
                while got < len(buf):
                    n = os.readv(fd, [view[got:]])
                    if n == 0:
                        break
                    got += n
                if got != st.st_size:
                    raise Rejected("changed while read (JAX may be writing it)")
                del view
                del buf[got:]
                return _Read(bytes(buf), _ident(st))
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def remove(self, key: str, read: _Read) -> bool:
        """Remove ``<key>-cache`` if it is still the regular file ``read`` came from, and
        ``<key>-atime`` if it is a regular file; True if the entry file was removed."""
        dfd = self._dir_fd()
        try:
            name = key + CACHE_SUFFIX
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if not stat.S_ISREG(st.st_mode) or _ident(st) != read.ident:
                return False
            os.unlink(name, dir_fd=dfd)
            atime = key + ATIME_SUFFIX
            try:
                if stat.S_ISREG(os.stat(atime, dir_fd=dfd, follow_symlinks=False).st_mode):
                    os.unlink(atime, dir_fd=dfd)
            except FileNotFoundError:
                pass
            return True
        finally:
            os.close(dfd)


# What adopt() did with one file.
ADOPTED = "adopted"  # published (or found present) and removed from JAX's directory
PRESENT = "present"  # the store already had the key; JAX's duplicate removed
SERVED = "served"  # valid and returned, but left in place (read-only store or put refused)
REJECTED = "rejected"
MISSING = "missing"


@dataclasses.dataclass
class Outcome:
    status: str
    value: bytes | None = None
    reason: str | None = None
    name: str | None = None  # the JAX key the value came from


def adopt(
    store: _CoreStore,
    source: JaxCacheDir,
    key: str,
    *,
    names: Sequence[str] = (),
    formats: frozenset[str],
    meta: Mapping[str, str] | Callable[[bytes], Mapping[str, str]] | None = None,
    max_bytes: int = MAX_ENTRY_BYTES,
) -> Outcome:
    """Adopt JAX's entry for ``key`` (or, failing it, the first of ``names``: the keys JAX
    alone gave the same program) from ``source`` into ``store`` under ``key``.

    A valid value is put into the store; once the store holds the key (this put or an
    earlier one), JAX's file is removed, so it is kept once. A read-only store, or a put the
    store refuses (over budget, a failed write), serves the value but leaves the file. A
    file that is not a valid value is left in place and reported as rejected. Never raises
    for what is in the directory; ``OSError`` only if the directory cannot be opened."""
    rejected: Outcome | None = None
    for name in (key, *[n for n in names if n != key]):
        if not valid_key(name):
            continue  # not a name JAX gives a file: no such file in its directory
        try:
            read = source.read(name, max_bytes)
            if read is None:
                continue
            check_value(read.value, formats)
        except Rejected as exc:
            if rejected is None:
                rejected = Outcome(REJECTED, reason=str(exc), name=name)
            continue
        if store.read_only:
            return Outcome(SERVED, read.value, name=name)
        entry_meta = dict(meta(read.value) if callable(meta) else meta or {})
        stored = store.put(key, read.value, meta=entry_meta)
        if not stored and key not in store:
            return Outcome(SERVED, read.value, "the store did not take it", name=name)
        try:
            source.remove(name, read)
        except OSError as exc:
            logger.debug("xla_pcache: could not remove %s from %s: %s", name, source.path, exc)
        return Outcome(ADOPTED if stored else PRESENT, read.value, name=name)
    return rejected or Outcome(MISSING)
