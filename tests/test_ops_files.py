"""What ships for operators stays true to the code: the systemd unit (systemd's own checks, its
hardening score, the exit statuses it stops retrying on, its stop timeout against the shutdown grace),
the example settings file (exactly the settings queen/config.py knows, at their defaults), and the
Containerfile (numeric user, a health check that works without curl, grace below the stop timeout,
a core compiled in a build stage of its own)."""

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from queen.cli.serve import EXIT_DATA_DIR_IN_USE, EXIT_DATA_REFUSED, env_name
from queen.config import Config, config_fields
from queen.testing import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "ops" / "queen.service"
ENV_EXAMPLE = ROOT / "ops" / "queen.env"
CONTAINERFILE = ROOT / "Containerfile"
RUNTIME_STOP_TIMEOUT_S = 10  # docker's and podman's default before SIGKILL
EXPOSURE_MAX = 2.0


def unit_settings(text: str) -> dict[str, list[str]]:
    """The [Service] section's settings, every value of a setting given more than once."""
    settings: dict[str, list[str]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


SERVICE = unit_settings(UNIT.read_text())


def unit_environment() -> dict[str, str]:
    return dict(value.split("=", 1) for line in SERVICE["Environment"] for value in line.split())


def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        message = ("SKIPPED LOUDLY: systemd-analyze is not installed, so the unit's security score and "
                   "verify are not checked (apt-get install systemd)")
        print(message, file=sys.stderr)
        pytest.skip(message)
    version = int(re.search(r"systemd (\d+)", subprocess.run([path, "--version"], capture_output=True,
                                                             text=True).stdout).group(1))
    if version < 252:
        message = f"SKIPPED LOUDLY: systemd-analyze {version} has no --offline (252 and later)"
        print(message, file=sys.stderr)
        pytest.skip(message)
    return path


def test_the_unit_is_rated_at_most_2_0_by_systemd_analyze_security():
    done = subprocess.run([systemd_analyze(), "security", "--offline=true", "--no-pager", str(UNIT)],
                          capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for queen\.service: (\d+\.\d+)", done.stdout)
    assert match, done.stdout + done.stderr
    assert float(match.group(1)) <= EXPOSURE_MAX, done.stdout


def test_systemd_analyze_verify_finds_nothing(tmp_path):
    # verify insists ExecStart's program exists: the one in the unit lives in /opt on a real host,
    # so a copy points at this interpreter instead; every other line is checked as shipped.
    unit = tmp_path / "queen.service"
    unit.write_text(re.sub(r"(?m)^ExecStart=\S+", f"ExecStart={Path(sys.executable).resolve()} -m queen",
                           UNIT.read_text()))
    done = subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_unit_stops_retrying_on_exactly_the_codes_a_restart_cannot_cure():
    [codes] = SERVICE["RestartPreventExitStatus"]
    assert sorted(int(code) for code in codes.split()) == sorted([EXIT_DATA_REFUSED, EXIT_DATA_DIR_IN_USE])
    assert SERVICE["Restart"] == ["on-failure"]


def test_the_unit_waits_for_ready_and_gives_shutdown_its_grace():
    assert SERVICE["Type"] == ["notify"] and SERVICE["NotifyAccess"] == ["main"]
    [stop_timeout] = SERVICE["TimeoutStopSec"]
    assert float(stop_timeout) >= Config().shutdown_grace_s + 10  # the grace, then an fsync and exit
    assert any("-HUP" in line for line in SERVICE["ExecReload"])


def test_the_unit_needs_no_user_nor_directory_made_by_hand():
    assert SERVICE["DynamicUser"] == ["yes"] and SERVICE["StateDirectory"] == ["queen"]
    assert unit_environment()["QUEEN_DATA_DIR"] == "%S/queen"
    assert SERVICE["EnvironmentFile"] == ["-/etc/queen/queen.env"]


def env_example() -> dict[str, str]:
    return dict(line[1:].split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line.startswith("#QUEEN_"))


def test_the_env_example_lists_exactly_the_settings_the_server_reads():
    assert sorted(env_example()) == sorted(env_name(name) for name, *_ in config_fields())


def test_the_env_example_shows_each_default_or_what_the_unit_sets():
    unit_values = {"QUEEN_DATA_DIR": "/var/lib/queen"}  # %S/queen, as systemd spells it
    for name, kind, default, _, _ in config_fields():
        shown = env_example()[env_name(name)]
        expected = unit_values.get(env_name(name), ("1" if default else "0") if kind == "bool" else str(default))
        assert shown == expected, name


# The Containerfile is read here, not built: .ci/image builds and runs it where podman can (it needs
# a base image, a runtime allowed to start a container, and minutes of CPU).
def containerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines = [line for line in CONTAINERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def instruction(name: str) -> list[str]:
    return [args for kind, args in containerfile() if kind == name]


def stages() -> list[list[tuple[str, str]]]:
    """The build's stages in order, each its instructions from its FROM on."""
    found: list[list[tuple[str, str]]] = []
    for kind, args in containerfile():
        if kind == "FROM":
            found.append([])
        if found:
            found[-1].append((kind, args))
    return found


def test_the_image_runs_a_core_compiled_in_a_stage_of_its_own_with_a_compiler():
    """The slim base has no C compiler, so a one-stage build silently installed the pure-Python core.
    A build stage adds one and installs there, setup.py (which compiles) included; the image copies
    that and refuses to build unless its core is the compiled one."""
    assert len(stages()) >= 2, "one stage: nothing compiles the core"
    *_, build, image = stages()
    build_from, alias = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", build[0][1], re.IGNORECASE).groups()
    assert image[0][1] == build_from  # one base: the environment's Python is where it was built
    build_runs = " ".join(args for kind, args in build if kind == "RUN")
    assert re.search(r"apt-get install .*\bgcc\b", build_runs)
    assert any(kind == "COPY" and "setup.py" in args.split() for kind, args in build)
    assert any(kind == "COPY" and args.startswith(f"--from={alias} ") for kind, args in image)
    image_runs = " ".join(args for kind, args in image if kind == "RUN")
    assert "gcc" not in image_runs and "_native.COMPILED" in image_runs
    assert "QUEEN_PURE" not in CONTAINERFILE.read_text()


def key_values(args: str) -> dict[str, str]:
    return {key: value.strip('"') for key, value in re.findall(r'(\S+?)=("[^"]*"|\S+)', args)}


def test_the_image_runs_as_a_numeric_user_that_is_not_root():
    user = instruction("USER")[-1].strip()
    assert user.isdigit() and int(user) != 0


def test_the_image_stops_with_sigterm_and_a_grace_below_the_runtime_stop_timeout():
    assert instruction("STOPSIGNAL") == ["SIGTERM"]
    env = {k: v for args in instruction("ENV") for k, v in key_values(args).items()}
    assert float(env["QUEEN_SHUTDOWN_GRACE_S"]) <= RUNTIME_STOP_TIMEOUT_S - 2  # time left to fsync and exit
    assert env["QUEEN_DATA_DIR"] == "/data" and json.loads(instruction("VOLUME")[0]) == ["/data"]


def test_the_image_carries_oci_labels_true_to_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    labels = {k: v for args in instruction("LABEL") for k, v in key_values(args).items()}
    args = {k: v for a in instruction("ARG") for k, v in key_values(a).items()}
    prefix = "org.opencontainers.image."
    assert {key[len(prefix):] for key in labels} >= {"title", "description", "source", "licenses", "version"}
    assert labels[prefix + "licenses"] == project["license"]
    assert labels[prefix + "version"] == "$VERSION" and args["VERSION"] == project["version"]


def healthcheck_command() -> list[str]:
    [healthcheck] = instruction("HEALTHCHECK")
    return json.loads(healthcheck.split("CMD", 1)[1])


def test_the_healthcheck_needs_only_python_and_tells_a_live_server_from_none(tmp_path):
    command = healthcheck_command()
    assert command[0] == "python"  # what the slim image has; no curl there
    run = [sys.executable, *command[1:]]
    server = ServerProcess(str(tmp_path / "data")).start()
    try:
        healthy = subprocess.run(run, env={"QUEEN_PORT": str(server.port)}, capture_output=True, timeout=30)
    finally:
        assert server.stop() == 0
    assert healthy.returncode == 0, healthy.stderr
    down = subprocess.run(run, env={"QUEEN_PORT": str(server.port)}, capture_output=True, timeout=30)
    assert down.returncode != 0
