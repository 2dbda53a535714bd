"""The rule for commit messages (scripts/commit_subjects.sh): a subject of at most 72
characters, then a blank line. Checked on real repositories made here: every commit after the
start (CI's lint phase), a shallow clone that lacks the start, and one message (the
commit-msg hook)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "commit_subjects.sh"
HOOK = REPO / "scripts" / "hooks" / "commit-msg"
# Commit times, seconds since the epoch: the start, and one before and after it.
BEFORE, START, AFTER = 1_700_000_000, 1_700_001_000, 1_700_002_000


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com")
    env.update(GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    return env


def _git(repo: Path, *args: str, when: int | None = None) -> str:
    env = _env(repo.parent)
    if when is not None:
        env["GIT_COMMITTER_DATE"] = env["GIT_AUTHOR_DATE"] = f"{when} +0000"
    out = subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _commit(repo: Path, message: str, when: int) -> str:
    _git(repo, "commit", "-q", "--allow-empty", "--no-verify", "-m", message, when=when)
    return _git(repo, "rev-parse", "HEAD")


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    return repo


def _check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=repo,
        env=_env(repo.parent),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_long_subject_after_the_start_fails_and_one_before_it_does_not(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    _commit(repo, "An old subject from before the rule, " + "much too long " * 5, BEFORE)
    start = _commit(repo, "The start", START)
    _commit(repo, "x" * 72 + "\n\nA subject of 72 characters, then a body.", AFTER)
    ok = _check(repo, "--since", start, str(START))
    assert ok.returncode == 0, ok.stderr
    long = _commit(repo, "y" * 73, AFTER + 1)
    _commit(repo, "A later commit keeps the rule", AFTER + 2)
    bad = _check(repo, "--since", start, str(START))
    assert bad.returncode == 1
    assert f"{long[:7]}: the subject is 73 characters" in bad.stderr, bad.stderr


def test_a_body_without_a_blank_line_before_it_fails(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    start = _commit(repo, "The start", START)
    _commit(repo, "A short subject\nand the body at once", AFTER)
    bad = _check(repo, "--since", start, str(START))
    assert bad.returncode == 1
    assert "leave the second line blank" in bad.stderr, bad.stderr


def test_characters_are_counted_not_bytes(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    start = _commit(repo, "The start", START)
    _commit(repo, "é" * 72, AFTER)
    ok = _check(repo, "--since", start, str(START))
    assert ok.returncode == 0, ok.stderr
    _commit(repo, "é" * 73, AFTER + 1)
    assert _check(repo, "--since", start, str(START)).returncode == 1


def test_a_shallow_clone_without_the_start_checks_what_it_holds_and_says_so(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    start = _commit(repo, "The start", START)
    _commit(repo, "Made after the start, " + "and too long " * 5, AFTER)
    _commit(repo, "Keeps the rule", AFTER + 1)
    clones = {}
    for depth in (1, 2):
        clone = tmp_path / f"depth{depth}"
        _git(repo, "clone", "-q", f"--depth={depth}", f"file://{repo}", str(clone))
        clones[depth] = clone
    # Depth 1: the head alone, which keeps the rule.
    ok = _check(clones[1], "--since", start, str(START))
    assert ok.returncode == 0, ok.stderr
    assert "is not in this shallow clone; checked the 1 commit(s)" in ok.stderr, ok.stderr
    # Depth 2: the long subject made after the start is there, and fails.
    bad = _check(clones[2], "--since", start, str(START))
    assert bad.returncode == 1
    assert "the subject is" in bad.stderr and "checked the 2 commit(s)" in bad.stderr


def test_a_shallow_clone_leaves_out_what_was_committed_before_the_start(
    tmp_path: Path,
) -> None:
    repo = _repo(tmp_path)
    _commit(repo, "Long, and from before the rule: " + "words " * 12, BEFORE)
    _commit(repo, "Keeps the rule", AFTER)
    clone = tmp_path / "clone"
    _git(repo, "clone", "-q", "--depth=2", f"file://{repo}", str(clone))
    ok = _check(clone, "--since", "0" * 40, str(START))
    assert ok.returncode == 0, ok.stderr
    assert "checked the 1 commit(s)" in ok.stderr


def test_the_hook_holds_one_message_to_the_same_rule(tmp_path: Path) -> None:
    def hook(message: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "MSG"
        path.write_text(message)
        return subprocess.run(["bash", str(HOOK), str(path)], capture_output=True, text=True)

    assert hook("# a comment git leaves out\n" + "z" * 72 + "\n\nbody\n").returncode == 0
    long = hook("z" * 73 + "\n")
    assert long.returncode == 1 and "73 characters" in long.stderr
    assert hook("subject\nbody at once\n").returncode == 1


def test_the_start_is_a_commit_of_this_project() -> None:
    # The start the lint phase counts from, and its time, are the project's own commit's
    # where the clone holds it.
    text = SCRIPT.read_text()
    start = text.split("\nSTART=", 1)[1].split("\n", 1)[0]
    start_time = text.split("\nSTART_TIME=", 1)[1].split("\n", 1)[0]
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    found = subprocess.run(
        ["git", "show", "-s", "--format=%ct", start], cwd=REPO, capture_output=True, text=True
    )
    if shallow == "true" and found.returncode != 0:
        return  # a shallow clone without it: the other tests cover that case
    assert found.stdout.strip() == start_time
