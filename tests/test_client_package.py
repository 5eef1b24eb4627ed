"""The SDK as its own distribution (client/): `pip install ./client`, not editable, into a fresh
venv gives `queen_client` and none of the server's dependencies, in a few MB; the public Queen MQ
client (`queen-mq` 2.6.0, import name `queen`) installs beside it and both import; its README's
example runs against a real server; and `py.typed` makes it typed for mypy.

The venv is made once per version of client/ (keyed by a hash of its files) under
~/.cache/queen-tests. Installing needs the package registry: when it cannot be reached the test
is skipped, loudly, never passed in silence. The version pins are checked without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from queen.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "client"
QUEEN_MQ = "queen-mq==2.6.0"
SERVER_ONLY = ["trio", "zstandard", "pyroaring", "cbor2", "cronsim"]
SIZE_MAX_BYTES = 5 << 20


# What a build of client/ leaves beside the sources: neither hashed nor copied.
BUILD_LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__")


def client_sources_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(CLIENT.rglob("*")):
        parts = path.relative_to(CLIENT).parts
        if path.is_file() and not any(Path(part).match(pattern) for part in parts for pattern in BUILD_LEFTOVERS):
            digest.update("/".join(parts).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def skip_loudly(what: str, stderr: str) -> None:
    message = f"SKIPPED LOUDLY: {what}: the package registry could not be reached:\n{stderr[-1500:]}"
    print(message, file=sys.stderr)
    pytest.skip(message)


def run(python: Path, *args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, **kwargs)


def pip_install(python: Path, *what: str) -> None:
    """Install, or skip loudly if the registry is out of reach (a failure with the registry up fails)."""
    done = run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *what)
    if done.returncode == 0:
        return
    probe = run(python, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                "-d", str(python.parent.parent / "probe"), "h11", timeout=300)
    if probe.returncode != 0:
        skip_loudly(f"pip install {' '.join(what)}", done.stderr + probe.stderr)
    pytest.fail(f"pip install {' '.join(what)} failed with the registry reachable:\n{done.stderr[-3000:]}")


def tree_bytes(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def client_venv() -> tuple[Path, dict]:
    """(the venv's python, what was measured when it was made)."""
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "queen-tests"
    key = client_sources_hash()
    home = cache_root / f"queen-client-{key}"
    python, marker = home / "bin" / "python", home / ".installed.json"
    if marker.exists():
        return python, json.loads(marker.read_text())
    for stale in cache_root.glob("queen-client-*"):  # venvs of earlier versions of client/
        shutil.rmtree(stale, ignore_errors=True)
    venv.create(home, with_pip=True, clear=True)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    before = tree_bytes(site)
    # Not editable: what a user of the SDK gets. From a copy, since pip builds in the source tree.
    source = home / "source"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    pip_install(python, str(source))
    shutil.rmtree(source)
    after = tree_bytes(site)
    added = {name: size for name, size in after.items() if before.get(name) != size}
    # Byte-code pip compiles counts too: it is on the user's disk the same.
    facts = {"site_packages_added_bytes": sum(added.values()),
             "distributions": sorted({name.split("/")[0] for name in added if ".dist-info/" in name})}
    alone = run(python, "-c", "import sys, queen_client; print('queen' in sys.modules)")
    assert alone.returncode == 0 and alone.stdout.strip() == "False", alone.stderr
    pip_install(python, QUEEN_MQ)
    marker.write_text(json.dumps(facts))
    return python, facts


def test_the_sdk_installs_alone_small_and_typed_without_the_servers_dependencies(client_venv):
    python, facts = client_venv
    size_mb = facts["site_packages_added_bytes"] / (1 << 20)
    print(f"pip install ./client added {size_mb:.1f} MB to site-packages: {', '.join(facts['distributions'])}")
    assert facts["site_packages_added_bytes"] < SIZE_MAX_BYTES, facts
    assert any(d.startswith("queen_client-") for d in facts["distributions"]), facts
    check = ("import importlib.util, json, sys, queen_client\n"
             "from pathlib import Path\n"
             "print(json.dumps({'client': hasattr(queen_client, 'Client') and hasattr(queen_client, 'SyncClient'),\n"
             "  'typed': (Path(queen_client.__file__).parent / 'py.typed').exists(),\n"
             "  'editable': 'client/queen_client' in Path(queen_client.__file__).as_posix(),\n"
             f"  'missing': [m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m) is None],\n"
             "  'loaded_server': sorted(m for m in sys.modules if m == 'queen' or m.startswith('queen.'))}))\n")
    done = run(python, "-c", check, cwd="/")  # not from the checkout, whose queen/ would be found first
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found == {"client": True, "typed": True, "editable": False, "missing": SERVER_ONLY,
                     "loaded_server": []}, found


def test_queen_mq_and_the_sdk_import_side_by_side(client_venv):
    python, _ = client_venv
    both = ("import importlib.metadata, sys, queen, queen_client\n"
            "assert queen.__file__.startswith(sys.prefix), queen.__file__  # queen-mq's, in the venv\n"
            "print(importlib.metadata.version('queen-mq'), queen.Queen.__name__, queen_client.Client.__name__)\n")
    done = run(python, "-c", both, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2.6.0", "Queen", "Client"]

def test_the_client_readme_example_runs_against_a_server(client_venv, tmp_path):
    python, _ = client_venv
    readme = (CLIENT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1 and 5 <= len(blocks[0].strip().splitlines()) <= 16, blocks
    with ServerProcess(str(tmp_path / "data")) as server:
        example = blocks[0].replace('"http://127.0.0.1:6632"', repr(server.url))
        done = run(python, "-c", example, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello\n"


def test_the_server_pins_the_sdk_at_its_own_version():
    """One version for both: the server's client commands run on the SDK of the same checkout."""
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert f"{client['name']}=={client['version']}" in server["dependencies"]
    assert server["version"] == client["version"]
    import queen
    import queen_client
    assert queen.__version__ == queen_client.__version__ == client["version"]
    assert client["license"] == "Apache-2.0" and "Typing :: Typed" in client["classifiers"]
    assert sorted(re.split(r"[<>=]", d)[0] for d in client["dependencies"]) == ["anyio", "h11", "orjson"]


def test_mypy_strict_sees_the_sdk_as_typed(client_venv, tmp_path):
    """py.typed ships: mypy --strict analyses a program using queen_client.Client instead of
    refusing the import as untyped ([import-untyped] without the marker)."""
    python, _ = client_venv
    marker = python.parent.parent / ".mypy-installed"
    if not marker.exists():
        pip_install(python, "mypy")
        marker.write_text("mypy")
    program = tmp_path / "use_sdk.py"
    program.write_text("import queen_client\n\n\n"
                       "async def main() -> None:\n"
                       "    async with queen_client.Client('http://127.0.0.1:6632') as client:\n"
                       "        print(await client.kv.get('app', 'k'))\n")
    done = run(python, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(program), cwd=tmp_path)
    assert done.returncode == 0 and "import-untyped" not in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("how", ["main", "python -m queen"])
def test_serve_without_the_servers_dependencies_says_what_to_install_in_one_line(tmp_path, how):
    """`queen serve` where trio cannot be imported (the package installed without its dependencies):
    one line naming what to install, exit 2, no traceback, nothing made on disk."""
    data = tmp_path / "data"
    argv = ["serve", "--data-dir", str(data)]
    start = ("from queen.cli import main; sys.exit(main(ARGV))" if how == "main" else
             "import runpy; sys.argv = ['queen', *ARGV]; runpy.run_module('queen', run_name='__main__')")
    code = f"import sys; sys.modules['trio'] = None; ARGV = {argv!r}; {start}"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "no module 'trio'" in done.stderr and "pip install ./client ." in done.stderr, done.stderr
    assert not data.exists()
