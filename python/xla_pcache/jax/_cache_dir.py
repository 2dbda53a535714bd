"""Reading a directory JAX's own persistent cache (``jax._src.lru_cache.LRUCache``) filled:
its names, its files read under bounds, and their removal. What is done with an entry read
here (the rules of adoption) is in ``_adopt.py``.

JAX's file cache keeps each executable in ``<key>-cache``: 4 bytes of compile time (whole
seconds, big endian) and the serialized executable, compressed with zstd when JAX finds
``compression.zstd`` or ``zstandard`` and with zlib otherwise. With a size limit it also
writes ``<key>-atime`` beside it and a ``.lockfile``. Every JAX from 0.4.36 to 0.12 writes
this format; the value in the file is byte for byte what JAX hands the adapter's ``put``,
under the same key.

Everything read from the directory is untrusted, and bounded before anything is allocated
for it: only names of the shape JAX writes (``<module name>-<64 hex digits>-cache``, no
``/``) are considered; files are opened relative to the directory without following links
and without blocking (a FIFO) and must be regular files within the bound; the first bytes
are checked (the compression format's header: a zstd frame must declare a window this
reader accepts, and its size where the running JAX needs it) before the rest is read; the
file is then read a piece at a time, each piece decompressed (output capped per call, kept
nowhere) and checked before the next is read, so a file that is not a value JAX can read
(a sparse file, a decompression bomb, a file JAX is still writing) costs at most a piece
and a window of memory.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from typing import Any

CACHE_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"
# ``<module name>-<sha256 hex>``; the module name is whatever the program's jitted function
# is called, so only what would make the name unsafe is refused.
_KEY = re.compile(r"[^/\x00]{1,190}-[0-9a-f]{64}")
_NAME_MAX = 255
# Larger files than this are never read (JAX's own executables are far smaller); the
# store's budget lowers it further (``_adopt.entry_bound``).
MAX_ENTRY_BYTES = 2 << 30
# A value decompressing to more than this many times its size is refused unread to the end.
_MAX_RATIO = 1000
# The first read: enough for any frame header, so the format is checked before the rest.
_HEAD = 4096
# Each further read, and the most one decompression call may produce.
_PIECE = 1 << 20
_OUT_CAP = 1 << 20
# The largest zstd window a frame may ask for (16 MiB; JAX's default level uses 2 MiB at
# most, zstd's levels up to 19 at most 8 MiB): a streaming decoder allocates it.
_ZSTD_WINDOW_LOG_MAX = 24
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
    """A zstd decompressor module as JAX picks it: ``compression.zstd``, else
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


def _is_stdlib_zstd(mod: Any) -> bool:
    return hasattr(mod, "get_frame_info")


def decodable_formats() -> frozenset[str]:
    """The formats this process can check: zlib, and zstd when a zstd module is there."""
    return frozenset({ZLIB, ZSTD} if _zstd_module() is not None else {ZLIB})


# --- checking a value as it is read ---------------------------------------------------------


class _Check:
    """Decompresses a value piece by piece as JAX would before deserializing it, keeping
    nothing: each call's output is capped and counted against ``limit``. A subclass makes
    the decompressor ``_d`` (zlib's or the standard library's zstd, alike in ``eof``,
    ``unused_data`` and ``decompress(data, max_length)``), names what it reads (``what``)
    and says what to feed it next (``_rest``)."""

    what = ""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.produced = 0
        self.head = b""  # the first decompressed bytes: JAX's compile time
        self._d: Any = None

    def _out(self, chunk: bytes | memoryview) -> None:
        if len(self.head) < _TIME_BYTES:
            self.head += bytes(chunk[: _TIME_BYTES - len(self.head)])
        self.produced += len(chunk)
        if self.produced > self.limit:
            raise Rejected("decompresses to more than the bound")

    def _rest(self, out: bytes) -> bytes | None:
        """What to decompress next after a call that gave ``out`` without reaching the
        end; None when the decompressor wants the next piece."""
        raise NotImplementedError

    def feed(self, piece: bytes) -> None:
        d = self._d
        if d.eof:
            raise Rejected(f"bytes after the end of the {self.what}")
        data: bytes | None = piece
        while data is not None:
            out = d.decompress(data, _OUT_CAP)
            self._out(out)
            if d.eof:
                if d.unused_data:
                    raise Rejected(f"bytes after the end of the {self.what}")
                return
            data = self._rest(out)

    def finish(self) -> None:
        if not self._d.eof:
            raise Rejected(f"{self.what} ends early (truncated, or still being written)")


class _Zlib(_Check):
    what = "zlib stream"

    def __init__(self, head: bytes, limit: int) -> None:
        super().__init__(limit)
        if len(head) < 2 or head[0] & 0x0F != 8 or (head[0] << 8 | head[1]) % 31:
            raise Rejected("not a zlib stream")
        self._d = zlib.decompressobj()

    def _rest(self, out: bytes) -> bytes | None:
        data: bytes = self._d.unconsumed_tail
        # A full output may leave more to come from input already taken.
        return data if data or len(out) >= _OUT_CAP else None


class _StdlibZstd(_Check):
    """``compression.zstd`` (Python 3.14): JAX's ``zstd.decompress`` reads a frame with or
    without a declared size."""

    what = "zstd frame"

    def __init__(self, mod: Any, head: bytes, limit: int) -> None:
        super().__init__(limit)
        try:
            info = mod.get_frame_info(head)
        except Exception as exc:
            raise Rejected(f"not a zstd frame: {exc}") from None
        declared = getattr(info, "decompressed_size", None)
        if declared is not None and declared > limit:
            raise Rejected("declares more decompressed bytes than the bound")
        param = mod.DecompressionParameter.window_log_max
        self._d = mod.ZstdDecompressor(options={param: _ZSTD_WINDOW_LOG_MAX})

    def _rest(self, out: bytes) -> bytes | None:
        # The decompressor keeps what it has not given out yet: ask again with nothing new.
        return None if self._d.needs_input else b""


def _zstandard_header(mod: Any, head: bytes, limit: int) -> int:
    """The size a ``zstandard`` frame declares, checked: JAX's one-shot
    ``ZstdDecompressor().decompress`` cannot read a frame that declares none (it would be
    a decompression bomb's way past any bound), nor one over the bound."""
    try:
        params = mod.get_frame_parameters(head)
    except Exception as exc:
        raise Rejected(f"not a zstd frame: {exc}") from None
    declared = int(params.content_size)
    if declared < 0 or declared == getattr(mod, "CONTENTSIZE_UNKNOWN", -1):
        raise Rejected("a zstd frame that declares no size, which this JAX cannot read")
    if declared > limit:
        raise Rejected("declares more decompressed bytes than the bound")
    if declared <= _TIME_BYTES:
        raise Rejected("holds no executable")
    if params.window_size > 1 << _ZSTD_WINDOW_LOG_MAX:
        raise Rejected("asks for a zstd window larger than the bound")
    return declared


# --- reading a file -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Read:
    """A checked ``<key>-cache`` file: its bytes (the value as JAX wrote it), its format,
    and JAX's compile time in whole seconds (None if it could not be read)."""

    value: bytearray
    fmt: str
    jax_seconds: int | None
    # Which file it was: an inode number alone may be reused by a file written since.
    ident: tuple[int, int, int, int]


def _ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class _Pieces:
    """A file (``read(n)``: its next bytes, as ``os.read``) read a piece at a time into one
    buffer that keeps it, never past the ``size`` it had when opened (a file that grows or
    shrinks meanwhile is refused)."""

    def __init__(self, read: Callable[[int], bytes], size: int) -> None:
        self._read = read
        self.size = size
        self.kept = bytearray()

    def read(self, n: int = _PIECE) -> bytes:
        """Up to ``n`` more bytes (b"" at the end)."""
        want = min(n, self.size - len(self.kept))
        if want <= 0:
            return b""
        data = self._read(want)
        if not data:
            raise Rejected("changed while read (JAX may be writing it)")
        self.kept += data
        return data

    def check_end(self) -> None:
        if len(self.kept) < self.size:
            raise Rejected("bytes after the end of the compressed value")
        if self._read(1):
            raise Rejected("changed while read (JAX may be writing it)")


def _check_zstandard(mod: Any, src: _Pieces, head: bytes, limit: int) -> int:
    """Streams a ``zstandard`` frame from ``src`` with each call's output capped, to the
    size it declared; JAX's compile time in whole seconds."""
    declared = _zstandard_header(mod, head, limit)
    served = [head]

    class _Source:
        # zstandard's reader pulls its input: the first bytes (already read), then pieces.
        def read(self, n: int) -> bytes:
            if served:
                return served.pop()
            return src.read(min(n, _PIECE))

    dctx = mod.ZstdDecompressor(max_window_size=1 << _ZSTD_WINDOW_LOG_MAX)
    out = bytearray(_OUT_CAP)
    produced = 0
    first = b""
    with dctx.stream_reader(_Source(), read_size=_PIECE) as reader:
        while True:
            n = reader.readinto(out)
            if not n:
                break
            if len(first) < _TIME_BYTES:
                first += bytes(out[: min(n, _TIME_BYTES - len(first))])
            produced += n
            if produced > declared:
                raise Rejected("decompresses to more than its frame declares")
    if produced != declared:
        raise Rejected("zstd frame ends early (truncated, or still being written)")
    src.check_end()
    return int.from_bytes(first, "big")


def check_file(
    read: Callable[[int], bytes], size: int, formats: frozenset[str]
) -> tuple[bytearray, str, int]:
    """Reads a value of ``size`` bytes (``read(n)``: its next bytes) under the bounds above
    and checks it is one whole value in a format of ``formats`` holding a compile time and
    an executable. Returns (its bytes, its format, JAX's compile time in whole seconds);
    raises ``Rejected`` saying why not. The executable itself is parsed only by JAX's
    backend: if that fails, JAX compiles again and its put replaces the adopted entry."""
    src = _Pieces(read, size)
    head = src.read(_HEAD)
    fmt = ZSTD if head[:4] == _ZSTD_MAGIC else ZLIB
    if fmt not in formats:
        raise Rejected(f"{fmt}-compressed; this JAX reads {'/'.join(sorted(formats))} only")
    limit = max(size, 1) * _MAX_RATIO
    try:
        if fmt == ZSTD:
            mod = _zstd_module()
            if mod is None:
                raise Rejected("zstd-compressed, and no zstd module to read it")
            if not _is_stdlib_zstd(mod):
                return src.kept, fmt, _check_zstandard(mod, src, head, limit)
            check: _Check = _StdlibZstd(mod, head, limit)
        else:
            check = _Zlib(head, limit)
        piece = head
        while piece:
            check.feed(piece)
            piece = src.read()
        check.finish()
        src.check_end()
    except (Rejected, OSError):
        raise
    except Exception as exc:  # zlib.error, ZstdError, ...: not a value JAX can read
        raise Rejected(f"does not decompress ({fmt}): {exc}") from None
    if check.produced <= _TIME_BYTES:
        raise Rejected("holds no executable")
    return src.kept, fmt, int.from_bytes(check.head, "big")


def check_value(value: bytes | bytearray | memoryview, formats: frozenset[str]) -> str:
    """``check_file`` of a value held in memory; returns its format."""
    data = memoryview(value).cast("B")
    at = 0

    def read(n: int) -> bytes:
        nonlocal at
        piece = bytes(data[at : at + n])
        at += len(piece)
        return piece

    return check_file(read, len(data), formats)[1]


def value_seconds(value: bytes | bytearray | memoryview) -> int | None:
    """The whole seconds JAX wrote in front of the executable in a value, read from its
    first bytes alone (output capped at those 4 bytes, window bounded); None if they cannot
    be read."""
    data = bytes(memoryview(value).cast("B")[:65536])
    head = b""
    try:
        if data[:4] != _ZSTD_MAGIC:
            head = zlib.decompressobj().decompress(data, _TIME_BYTES)
        else:
            mod = _zstd_module()
            if mod is None:
                return None
            if _is_stdlib_zstd(mod):
                param = mod.DecompressionParameter.window_log_max
                d = mod.ZstdDecompressor(options={param: _ZSTD_WINDOW_LOG_MAX})
                head = d.decompress(data, _TIME_BYTES)
            else:
                dctx = mod.ZstdDecompressor(max_window_size=1 << _ZSTD_WINDOW_LOG_MAX)
                with dctx.stream_reader(data) as reader:
                    head = reader.read(_TIME_BYTES)
    except Exception:
        return None
    return int.from_bytes(head[:_TIME_BYTES], "big") if len(head) >= _TIME_BYTES else None


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

    def read(self, key: str, max_bytes: int, formats: frozenset[str]) -> Read | None:
        """``<key>-cache`` read and checked (``check_file``); None when there is no such
        file. Raises ``Rejected`` for a link, a FIFO, a directory, a file over
        ``max_bytes`` and a value that does not check; ``OSError`` when the directory
        cannot be opened."""
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
                value, fmt, secs = check_file(lambda n: os.read(fd, n), st.st_size, formats)
                return Read(value, fmt, secs, _ident(st))
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def remove(self, key: str, read: Read) -> bool:
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
