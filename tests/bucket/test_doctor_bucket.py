"""``xla-pcache doctor --path <bucket>`` makes each request a host makes of the bucket once,
in a fresh process with only the environment a user sets, on each protocol: every step
passes on a bucket that works, and a set-up that cannot work names the request that failed
and why (wrong credentials, no server), with exit status 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import obstore

from tests.tiers.servers import BucketServer, bucket_client, fresh_prefix


def doctor(url: str, env: dict[str, str], home: Path) -> tuple[int, dict[str, Any]]:
    run = subprocess.run(
        [sys.executable, "-m", "xla_pcache", "doctor", "--json", "--path", url],
        env={**os.environ, **env, "XDG_CACHE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, json.loads(run.stdout)


def test_doctor_makes_each_request_of_a_writer_and_leaves_nothing(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    rc, report = doctor(server.url(prefix), server.env(), tmp_path / "h")
    steps = [(c["step"], c["ok"]) for c in report["cache"]["bucket_checks"]]
    assert steps == [
        ("list", True),
        ("read", True),
        ("create", True),
        ("overwrite", True),
        ("read back", True),
        ("delete", True),
    ], report
    assert not [p for p in report["problems"] if "bucket" in p], report["problems"]
    # The probe claim is gone; only what the doctor's framework probe keeps may be there.
    left = [str(o["path"]) for o in obstore.list(bucket_client(server, prefix)).collect()]
    assert not [p for p in left if "/claims/" in p], left
    assert rc == 0 or report["problems"], report


def test_doctor_on_a_read_only_path_only_lists_and_reads(
    tmp_path: Path, server: BucketServer
) -> None:
    prefix = fresh_prefix()
    _, report = doctor(server.url(prefix, ro="1"), server.env(), tmp_path / "h")
    steps = [(c["step"], c["ok"]) for c in report["cache"]["bucket_checks"]]
    assert steps == [("list", True), ("read", True)], report
    assert list(obstore.list(bucket_client(server, prefix)).collect()) == []


def test_doctor_names_the_request_refused_for_wrong_credentials(
    tmp_path: Path, server: BucketServer
) -> None:
    rc, report = doctor(
        server.url(fresh_prefix()), server.env(secret="wrong-secret-77aa"), tmp_path / "h"
    )
    assert rc == 1, report
    (problem,) = [p for p in report["problems"] if p.startswith("bucket ")]
    assert "list failed" in problem and "wrong-secret-77aa" not in problem, problem
    # S3 answers 403 for a wrong signature; GCS 401 for a token it does not take.
    assert ("401, the credentials were refused" in problem) or ("403, permission denied" in problem)
    assert report["cache"]["bucket_checks"][-1]["ok"] is False


def test_doctor_says_the_service_cannot_be_reached(tmp_path: Path, server: BucketServer) -> None:
    # The endpoint a closed port: nothing listens there.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {**server.env(), **server.point_at(closed), "XLA_PCACHE_REMOTE_TIMEOUT": "1"}
    rc, report = doctor(server.url(fresh_prefix()), env, tmp_path / "h")
    assert rc == 1, report
    (problem,) = [p for p in report["problems"] if p.startswith("bucket ")]
    assert "list failed (the service could not be reached" in problem, problem
