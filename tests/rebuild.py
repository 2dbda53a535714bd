"""A second build of an installed framework, for the tests that run two builds on one cache.

``second_build`` makes a venv beside this one whose framework binary differs from the
installed one only in bytes the loader ignores, as a rebuild from the same sources differs:
its GNU build-id note (when the file has one: what a rebuild changes) or bytes appended
after the ELF image (when it has none, as jaxlib's wheel objects). The new venv has the same
interpreter and a ``pyvenv.cfg`` of its own; its site-packages links every entry of this
one, except the directories and files on the way to the changed binary, which are its own:
files hard-linked where the filesystem allows (else copied), the changed binary really
copied. So it costs one copy of that binary and a few hundred links.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import sysconfig
from pathlib import Path

APPENDED = b"\0another build of the same sources\0" * 4


def build_id_span(path: Path) -> tuple[int, int] | None:
    """(offset, length) of the GNU build-id bytes of a little-endian ELF64 file, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        (phoff,) = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            (ptype,) = struct.unpack_from("<I", table, i * phentsize)
            if ptype != 4:  # PT_NOTE
                continue
            (offset,) = struct.unpack_from("<Q", table, i * phentsize + 8)
            (size,) = struct.unpack_from("<Q", table, i * phentsize + 32)
            f.seek(offset)
            notes = f.read(size)
            at = 0
            while at + 12 <= len(notes):
                namesz, descsz, kind = struct.unpack_from("<III", notes, at)
                name_at = at + 12
                desc_at = name_at + (namesz + 3) // 4 * 4
                if kind == 3 and notes[name_at : name_at + namesz] == b"GNU\0":
                    return offset + desc_at, descsz
                at = desc_at + (descsz + 3) // 4 * 4
    return None


def rebuilt_copy(src: Path, dst: Path) -> str:
    """``src`` copied to ``dst`` as another build: its build-id changed, or bytes appended.
    Says which."""
    shutil.copyfile(src, dst)
    shutil.copymode(src, dst)
    span = build_id_span(dst)
    with open(dst, "r+b") as f:
        if span is not None:
            f.seek(span[0])
            old = f.read(span[1])
            f.seek(span[0])
            f.write(bytes(b ^ 0xFF for b in old))
            return "build-id"
        f.seek(0, os.SEEK_END)
        f.write(APPENDED)
        return "appended"


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def second_build(dest: Path, binary: Path, own: Path) -> tuple[Path, str]:
    """A venv at ``dest`` like this one, with ``binary`` rebuilt (``rebuilt_copy``).
    ``own``: the entry of site-packages (a package directory, or ``binary`` itself) that is
    the new venv's own; every other entry is a link to this venv's. Returns its Python and
    how the binary was changed."""
    site = Path(sysconfig.get_paths()["purelib"])
    own = own.resolve()
    binary = binary.resolve()
    assert own.parent == site.resolve(), (own, site)
    new_site = dest / site.relative_to(sys.prefix)
    new_site.mkdir(parents=True)
    (dest / "bin").mkdir()
    shutil.copyfile(Path(sys.prefix) / "pyvenv.cfg", dest / "pyvenv.cfg")
    os.symlink(os.path.realpath(sys.executable), dest / "bin" / "python")
    how = ""
    for entry in sorted(site.iterdir()):
        target = new_site / entry.name
        if entry.resolve() != own:
            os.symlink(entry, target)
            continue
        if entry.is_file():
            how = rebuilt_copy(binary, target)
            continue
        for root, _dirs, files in os.walk(entry):
            rel = Path(root).relative_to(entry)
            (target / rel).mkdir(exist_ok=True)
            for name in files:
                src = Path(root) / name
                if src.resolve() == binary:
                    how = rebuilt_copy(src, target / rel / name)
                else:
                    _link_or_copy(src, target / rel / name)
    assert how, f"{binary} is not under {own}"
    return dest / "bin" / "python", how
