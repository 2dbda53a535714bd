"""The test servers' own harness: a port found free and taken before the server binds it
(as another process's outgoing connection may take it) costs a start, not the module's
tests."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.tiers import servers


def hold(monkeypatch: pytest.MonkeyPatch, at: int) -> tuple[socket.socket, list[int]]:
    """A listener's port, handed to the harness as its ``at``-th port found free (free ones
    otherwise), and the list of the ports it is handed."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    given: list[int] = []
    real = servers._free_port

    def free_port() -> int:
        given.append(int(taken.getsockname()[1]) if len(given) == at else real())
        return given[-1]

    monkeypatch.setattr(servers, "_free_port", free_port)
    return taken, given


def test_weed_starts_again_on_other_ports_when_one_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # The first start's last port (WebDAV's) is held.
    taken, given = hold(monkeypatch, at=10)
    with taken:
        s3 = servers.start_s3(tmp_path / "weed")
    request.addfinalizer(s3.stop)
    assert len(given) == 22, given  # two starts of eleven ports each
    assert servers._bucket_ready(s3.port)


def test_redis_starts_again_on_another_port_when_one_is_taken(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    taken, given = hold(monkeypatch, at=0)
    with taken:
        redis = servers.start_redis()
    request.addfinalizer(redis.stop)
    assert given[1:] == [redis.port] and redis.port != given[0], given
    assert redis.proc.poll() is None
