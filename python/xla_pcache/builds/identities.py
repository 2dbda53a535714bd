"""A runtime's build as this process has it: each file's identity (``_core.identify_binaries``:
the GNU build-id note where a file has one, else the BLAKE3 of its content, remembered in the
user's record under the file's device, inode, size, mtime and ctime, so a process start costs
a ``stat`` per file), what could not be read, and where the record is kept, or why nowhere
(one warning per framework and process, and the ``build_rehashes`` counter)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xla_pcache import _core
from xla_pcache._text import package_logger
from xla_pcache.builds.build import Build, FileIdentity, digest_of
from xla_pcache.builds.files import Wanted

logger = package_logger("xla_pcache")


def identify(framework: str, wanted: list[Wanted], record_dir: str | None = None) -> Build:
    """The build made of the files ``wanted``. Never raises for what is on disk: a file that
    cannot be read counts as unreadable (a warning). ``record_dir``: the user's record of
    identities, and no other (default ``$XDG_CACHE_HOME/xla_pcache-builds``, else a
    directory of this user's own on this host where that cannot be written). Identities
    computed that can be remembered nowhere are one warning per framework and process."""
    found, problems, (kept_in, skipped, unkept) = _core.identify_binaries(
        [path for _, path, _ in wanted], record_dir
    )
    files: list[FileIdentity] = []
    unreadable: list[str] = []
    for (role, path, name), got in zip(wanted, found, strict=True):
        if isinstance(got, str):
            unreadable.append(f"{role}/{name}: {got}")
            continue
        kind, hexid, changed_ns, computed, loaded, size = got
        files.append(
            FileIdentity(role, name, path, kind, hexid, int(changed_ns), computed, loaded, size)
        )
    if unreadable:
        logger.warning(
            "xla_pcache: %d file(s) of %s's runtime could not be read (%s); they count as "
            "unreadable in its build",
            len(unreadable),
            framework,
            "; ".join(unreadable[:3]),
        )
    if not files:
        logger.warning(
            "xla_pcache: no binary of %s's runtime was found; its entries are kept under a "
            "build that names none (every such installation shares them)",
            framework,
        )
    build = Build(
        framework,
        digest_of(framework, files, unreadable),
        tuple(files),
        tuple(unreadable),
        int(problems),
        kept_in,
        tuple(skipped),
        unkept,
    )
    if build.rehashed and not problems:
        # A refusal warned already (the core's warning names the record and why).
        _warn_unkept(build)
    return build


_warned_unkept: set[str] = set()


def _warn_unkept(build: Build) -> None:
    """One warning per framework and process: identities were computed and could be kept
    nowhere, so every process pays this again."""
    if build.framework in _warned_unkept:
        return
    _warned_unkept.add(build.framework)
    logger.warning(
        "xla_pcache: %s's runtime binaries (%d files, %.0f MB) were hashed to name its build, "
        "and their identities cannot be remembered (%s): every process hashes them again at "
        "its first compile. Set XDG_CACHE_HOME, XDG_RUNTIME_DIR or TMPDIR to a directory "
        "this user can write (xla-pcache doctor shows where the record is looked for).",
        build.framework,
        build.hashed,
        build.hashed_bytes / 1e6,
        build.record_unkept,
    )


_counted_rehash: set[str] = set()


def count_rehash(build: Build, store: Any) -> None:
    """Counts ``build_rehashes`` in ``store`` once per framework and process, when this
    process hashed the runtime with no record to keep it in. Never raises."""
    if not build.rehashed or build.framework in _counted_rehash:
        return
    _counted_rehash.add(build.framework)
    try:
        store.count_build_rehash()
    except Exception as exc:
        logger.debug("xla_pcache: counting a rehash of the runtime failed: %s", exc)


def usable(build: Callable[[], Build]) -> tuple[Build | None, str]:
    """This process's build by ``build`` (an adapter's ``_build.build``), or None and why
    it cannot key entries: its files could not be read, or a binary this process loaded was
    replaced on disk since (an install over a running program), so its executables are of a
    build nothing names; an entry filed under the wrong build is the one thing not to write."""
    try:
        found = build()
    except Exception as exc:
        return None, f"its runtime's build could not be identified ({type(exc).__name__}: {exc})"
    if not found.replaced:
        return found, ""
    return None, (
        "this process runs binaries replaced on disk since it loaded them ("
        + ", ".join(found.replaced[:3])
        + "): its executables are of a build nothing names"
    )
