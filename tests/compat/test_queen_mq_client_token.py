"""The public Queen MQ Python client (`queen-mq` 2.6.0, unchanged) against a `queen serve
--auth-file`: given a token (`Queen(url=..., bearer_token=...)`, sent as `Authorization: Bearer
<token>`), a representative subset of tests/compat/qmq_checks.py passes in a named tenant, and the
client meets 401 without a token or with a bad one, 403 with a reader's for a write, and nothing of
another tenant's. The calls are in tests/compat/qmq_token_checks.py, run by the client's own venv
(see test_queen_mq_client.py, whose venv and loud skip this shares).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from test_queen_mq_client import client_python

from queen.auth import AuthFile
from queen.testing import ServerProcess

CHECKS = Path(__file__).with_name("qmq_token_checks.py")


def test_the_public_queen_mq_client_works_with_a_token(tmp_path):
    python = client_python()
    path = str(tmp_path / "auth.json")
    file = AuthFile.load(path, missing_ok=True)
    tokens = {"QUEEN_TOKEN": file.add("mq-admin", "admin", "mq"),
              "QUEEN_READER_TOKEN": file.add("mq-reader", "reader", "mq"),
              "QUEEN_OTHER_TOKEN": file.add("other-admin", "admin", "other")}
    operator = file.add("ops", "admin", "*")
    file.save()
    with ServerProcess(str(tmp_path / "data"), "--auth-file", path) as server:
        done = subprocess.run([str(python), str(CHECKS)], env={**os.environ, "QUEEN_URL": server.url, **tokens},
                              capture_output=True, text=True, timeout=300)
        # What the client wrote is tenant mq's, not the default tenant's.
        status, view = server.request("GET", "/api/v1/tenant", headers={"authorization": f"Bearer {tokens['QUEEN_TOKEN']}"})
        status_default, default_queues = server.request("GET", "/api/v1/resources/queues",
                                                        headers={"authorization": f"Bearer {operator}"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"queen-mq 2.6.0 with a token: {len(report['passed'])} checks passed, {len(report['failed'])} failed")
    assert report["failed"] == {}, report["failed"]
    assert len(report["passed"]) == 33
    assert status == 200 and view["tenant"] == "mq" and view["usage"]["keys"] > 0 and view["usage"]["messages"] > 0
    assert status_default == 200 and default_queues["items"] == []
