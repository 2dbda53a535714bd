"""The test servers' own harness: a port found free and taken before the server binds it
(as another process's outgoing connection may take it) costs a start, not the module's
tests."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.tiers import servers


def test_weed_starts_again_on_other_ports_when_one_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    given: list[int] = []
    real = servers._free_port

    def free_port() -> int:
        # The first start's last port (WebDAV's) is one a listener holds.
        port = taken.getsockname()[1] if len(given) == 10 else real()
        given.append(port)
        return int(port)

    monkeypatch.setattr(servers, "_free_port", free_port)
    with taken:
        server = servers.start_s3(tmp_path / "weed")
    try:
        assert len(given) == 22, given  # two starts of eleven ports each
        assert servers._bucket_ready(server.port)
    finally:
        server.stop()


def test_redis_starts_again_on_another_port_when_one_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    given: list[int] = []
    real = servers._free_port

    def free_port() -> int:
        port = taken.getsockname()[1] if not given else real()
        given.append(port)
        return int(port)

    monkeypatch.setattr(servers, "_free_port", free_port)
    with taken:
        server = servers.start_redis()
    try:
        assert given[1:] == [server.port] and server.port != given[0], given
        assert server.proc.poll() is None
    finally:
        server.stop()
