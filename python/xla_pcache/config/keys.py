"""Trusted writers' keys read from the environment: the private key every put is signed with
(``XLA_PCACHE_SIGNING_KEY``, a key file ``xla-pcache keygen`` wrote) and the public keys whose
entries alone are served (``XLA_PCACHE_TRUSTED_KEYS``, inline or ``@FILE``). A key file is
opened as ssh opens its own: no link followed, no FIFO waited on, refused when others could
read the private key or add a trusted one; the core judges the keys themselves.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xla_pcache import _core
from xla_pcache.config.variables import SIGNING_KEY_VAR, TRUSTED_KEYS_VAR


def _key_bytes(text: str, what: str, name: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"invalid {name}: the {what} is not base64") from None


def _keys_the_core_takes(check: Callable[[Any], None], keys: Any, argument: str, name: str) -> None:
    """The core's verdict on keys read from ``name`` (``_core.check_signing_key`` /
    ``check_trusted_keys``: the key name's rule, no name given twice, 32-byte keys), the
    same a store gives them as its ``argument``; ``ValueError`` naming ``name`` otherwise."""
    try:
        check(keys)
    except ValueError as e:
        raise ValueError(f"invalid {name}: {str(e).removeprefix(argument + ': ')}") from None


def _key_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@dataclass(frozen=True)
class SigningKey:
    """A private key read from a key file: its name, and the 32 bytes (never shown)."""

    name: str
    path: str
    private: bytes = field(repr=False)


def _read_key_file(path: str, name: str, what: str, refused: int, why: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path``, opened without following a link or waiting on a
    FIFO (``O_NOFOLLOW | O_NONBLOCK``): a regular file whose mode has none of the bits
    ``refused``, or ``ValueError`` naming ``name``, the file and why (``why``, given the
    file's ``{mode}``, when it is the mode)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        cause = "a symbolic link (name the file itself)" if e.errno == errno.ELOOP else e.strerror
        raise ValueError(f"invalid {name} {path!r}: cannot open {what} ({cause})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"invalid {name} {path!r}: {what} is not a regular file")
        mode = stat.S_IMODE(st.st_mode)
        if mode & refused:
            raise ValueError(f"invalid {name} {path!r}: " + why.format(mode=f"{mode:04o}"))
        return f.read(limit)


def read_signing_key(path: str, name: str = SIGNING_KEY_VAR) -> SigningKey:
    """Reads a key file written by ``xla-pcache keygen``: one ``NAME:BASE64`` line (``#``
    comments allowed). It must be a regular file (not a link, not a FIFO) that group and
    others cannot access."""
    path = os.path.expanduser(path.strip())
    data = _read_key_file(
        path,
        name,
        "the private key file",
        0o077,
        "a private key readable or writable by group or others (mode {mode}); run chmod 600 on it",
        4096,
    )
    try:
        lines = _key_lines(data.decode("utf-8"))
    except UnicodeDecodeError:
        lines = []
    if len(lines) != 1 or ":" not in lines[0]:
        raise ValueError(
            f"invalid {name} {path!r}: expected one 'NAME:BASE64' line, as xla-pcache keygen writes"
        )
    key_name, b64 = (p.strip() for p in lines[0].split(":", 1))
    private = _key_bytes(b64, "private key", name)
    _keys_the_core_takes(_core.check_signing_key, (key_name, private), "signing_key", name)
    return SigningKey(key_name, path, private)


def _read_trusted_list(value: str, name: str) -> str:
    """The text of a trusted-keys list file (``@FILE``). Whoever can add a line to it signs
    for every process that reads it, so, as ssh's StrictModes does for its key files, it must
    be a regular file named directly (not reached through a link) that neither group nor
    others can write; anything else is refused, naming the file and why."""
    path = os.path.expanduser(value[1:].strip())
    data = _read_key_file(
        path,
        name,
        "the trusted-keys list",
        0o022,
        "the trusted-keys list is writable by group or others (mode {mode}), so they could add "
        "a key every reader trusts; run chmod go-w on it",
        (1 << 20) + 1,
    )
    if len(data) > 1 << 20:
        raise ValueError(f"invalid {name} {path!r}: the trusted-keys list is over 1 MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"invalid {name} {path!r}: the trusted-keys list is not UTF-8") from None


def parse_trusted_keys(value: str, name: str = TRUSTED_KEYS_VAR) -> tuple[tuple[str, bytes], ...]:
    """``NAME:BASE64[,NAME:BASE64...]``, or ``@FILE`` with one such key per line."""
    value = value.strip()
    if value.startswith("@"):
        items = _key_lines(_read_trusted_list(value, name))
    else:
        items = [v.strip() for v in value.split(",") if v.strip()]
    keys: list[tuple[str, bytes]] = []
    for item in items:
        if ":" not in item:
            raise ValueError(f"invalid {name}: {item[:80]!r} is not NAME:BASE64")
        key_name, b64 = (p.strip() for p in item.split(":", 1))
        keys.append((key_name, _key_bytes(b64, f"public key of {key_name!r}", name)))
    if not keys:
        raise ValueError(f"invalid {name} {value!r}: no keys in it")
    _keys_the_core_takes(_core.check_trusted_keys, keys, "trusted_keys", name)
    return tuple(keys)
