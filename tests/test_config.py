"""Settings resolve as flags over QUEEN_* variables over defaults, and --help tells each one."""

import subprocess
import sys

import pytest

from queen.cli import build_parser, resolve_config
from queen.config import Config, config_fields, validate


def resolve(argv, environ):
    return resolve_config(build_parser().parse_args(["serve", *argv]), environ)


def test_defaults_are_loopback_6632_and_queen_data():
    config = resolve([], {})
    assert (config.host, config.port, config.data_dir) == ("127.0.0.1", 6632, "./queen-data")
    assert validate(config) == []


def test_a_flag_wins_over_the_environment_which_wins_over_the_default():
    environ = {"QUEEN_PORT": "7000", "QUEEN_SHARD_COUNT": "2", "QUEEN_IDLE_TIMEOUT_S": "5.5"}
    config = resolve(["--port", "7001"], environ)
    assert (config.port, config.shard_count, config.idle_timeout_s) == (7001, 2, 5.5)


def test_a_malformed_environment_value_is_refused_by_name_as_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        resolve([], {"QUEEN_PORT": "many"})
    assert info.value.code == 2 and "QUEEN_PORT='many'" in capsys.readouterr().err


def test_impossible_settings_are_reported():
    problems = validate(Config(port=70000, shard_count=0, log_level="loud"))
    assert len(problems) == 3


def test_help_names_every_setting_and_its_variable():
    text = subprocess.run([sys.executable, "-m", "queen", "serve", "--help"], capture_output=True, text=True, check=True).stdout
    for name, *_ in config_fields():
        assert "--" + name.replace("_", "-") in text
        assert "QUEEN_" + name.upper() in text


def test_impossible_settings_stop_serve_with_status_2():
    done = subprocess.run([sys.executable, "-m", "queen", "serve", "--shard-count", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "shard count" in done.stderr
