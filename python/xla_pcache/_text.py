"""One gate for text shown to people. Paths, names, keys, metadata and error texts come from
whoever wrote the cache directory or the bucket; printed raw, a control sequence in one of
them (an OSC window title or clipboard write, a CSI clear-screen, a bidi override that shows
a name backwards) would act on the operator's terminal. Every string the CLI prints and every
record the package logs goes through ``shown`` (the CLI's output streams and a filter on
each package logger, the Rust core's forwarded records included)."""

from __future__ import annotations

import io
import logging
import threading
from typing import TextIO

# Bidi embeddings, overrides, isolates and marks. Python counts most of them as printable
# (format characters are not, but U+061C and friends vary by version): named here so they
# are escaped whatever the version's tables say. Everything else str.isprintable() refuses
# (C0, DEL, C1, other format characters, separators but the space, surrogates, unassigned)
# is escaped too.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


def shown(text: object, *, keep: str = "") -> str:
    """``text`` safe for a terminal or a log: every control character (C0, ESC, DEL, C1),
    bidi override, isolate or mark, line or paragraph separator, surrogate or unassigned
    code point made visible as ``\\x1b``, ``\\u202e`` and the like; characters in ``keep``
    (``"\\n"`` for a block of lines) pass. Text with none of them comes back as it is."""
    s = text.decode("utf-8", "backslashreplace") if isinstance(text, bytes) else str(text)
    if s.isprintable() and not any(c in _BIDI for c in s):
        return s
    return "".join(
        c if c in keep or (c.isprintable() and c not in _BIDI) else _escape(c) for c in s
    )


class ShownFilter(logging.Filter):
    """Makes each record's message ``shown``: a name or path from the cache directory in a
    warning reaches a terminal or log file escaped."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: the handler reports it as it would
            return True
        safe = shown(message)
        if safe != message:
            record.msg, record.args = safe, None
        return True


_FILTER = ShownFilter()


def package_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` for a logger of this package, its records ``shown``."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


class FirstWarning:
    """Logs a failure at WARNING the first time of its kind (what failed, the exception's
    type) and at DEBUG after: a broken cache fails on every compilation, and one warning
    says so without flooding a training log. ``head`` says what failed, from ``{what}`` and
    ``{key}``."""

    def __init__(self, logger: logging.Logger, head: str) -> None:
        self._logger = logger
        self._head = head
        self._seen: set[tuple[str, type[BaseException]]] = set()
        self._lock = threading.Lock()

    def __call__(self, what: str, key: str, exc: BaseException) -> None:
        with self._lock:
            first = (what, type(exc)) not in self._seen
            self._seen.add((what, type(exc)))
        self._logger.log(
            logging.WARNING if first else logging.DEBUG,
            "xla_pcache: %s: %s: %s%s",
            self._head.format(what=what, key=repr(key)),
            type(exc).__name__,
            exc,
            " (further failures of this kind are logged at debug level)" if first else "",
        )


class ShownStream(io.TextIOBase):
    """A text stream that writes everything ``shown`` (newlines and tabs kept) to
    ``raw``: the CLI's stdout and stderr, so no line it prints, however it was made, carries
    a control sequence from the cache. Rich writes its own (colours, a progress bar) to
    ``raw`` directly, with what it shows escaped by the caller."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.raw, "errors", None)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    def write(self, s: str) -> int:
        self.raw.write(shown(s, keep="\n\t"))
        return len(s)

    def flush(self) -> None:
        self.raw.flush()


def raw_stream(stream: TextIO) -> TextIO:
    """The stream under a ``ShownStream`` (or ``stream`` itself): where rich writes."""
    return stream.raw if isinstance(stream, ShownStream) else stream
