"""The `queen` command's parser, without a server: help for every argument, usage errors that show
the usage of the command they are about with a suggestion, and the shell completion scripts."""

import argparse
import shutil
import subprocess
import sys

import pytest

from queen.cli import build_parser, main


def walk(parser: argparse.ArgumentParser, path: str = "queen"):
    """(command path, action) for every action of every command, sub-commands included."""
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")


def test_every_argument_of_every_command_has_help():
    missing = []
    for path, action in walk(build_parser()):
        if isinstance(action, argparse._SubParsersAction):  # its commands are listed with their help
            missing += [f"{path} {choice.dest}" for choice in action._choices_actions if not choice.help]
        elif not action.help:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["kv", "put", "--ttl-second", "5", "app", "k", "v"], "usage: queen kv put ", "unrecognized option --ttl-second; did you mean --ttl?"),
    (["kv", "put", "app", "k", "v", "--forevr"], "usage: queen kv put ", "did you mean --forever?"),
    (["kv", "put", "app", "k", "v", "--ttl", "5", "--expct", "3"], "usage: queen kv put ", "did you mean --expect?"),
    (["serve", "--prot", "7000"], "usage: queen serve ", "did you mean --port?"),
    (["queue", "pop", "jobs", "--bacth", "2"], "usage: queen queue pop ", "did you mean --batch?"),
    (["--verison"], "usage: queen [", "did you mean --version?"),
])
def test_a_misspelt_option_shows_its_commands_usage_and_the_option_meant(capsys, argv, usage, hint):
    err = usage_error(capsys, *argv)
    assert err.startswith(usage) and hint in err, err


@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["kv", "pot", "app", "k", "v"], "usage: queen kv ", "invalid choice: 'pot'; did you mean 'put'?"),
    (["kvv", "get", "app", "k"], "usage: queen [", "invalid choice: 'kvv'; did you mean 'kv'?"),
    (["queue", "ack", "jobs", "--lease", "1", "--partition-id", "1", "--offset", "0", "--status", "complted"],
     "usage: queen queue ack ", "did you mean 'completed'?"),
])
def test_a_misspelt_command_or_choice_shows_the_usage_around_it_and_the_one_meant(capsys, argv, usage, hint):
    err = usage_error(capsys, *argv)
    assert err.startswith(usage) and hint in err, err


def test_an_argument_too_many_is_the_subcommands_usage_error(capsys):
    err = usage_error(capsys, "kv", "get", "app", "k", "extra")
    assert err.startswith("usage: queen kv get ") and "unrecognized arguments: extra" in err


def test_no_suggestion_when_nothing_is_close(capsys):
    err = usage_error(capsys, "kv", "get", "app", "k", "--zzzzzz")
    assert "unrecognized option --zzzzzz\n" in err


def test_values_that_only_look_like_options_still_parse():
    parser = build_parser()
    incr = parser.parse_args(["kv", "incr", "app", "n", "--by", "-1", "--ttl", "5"])
    assert incr.by == -1
    put = parser.parse_args(["kv", "put", "app", "k", "-", "--forev", "--string"])  # - is stdin; an abbreviation
    assert (put.value, put.forever, put.string) == ("-", True, True)
    spaced = parser.parse_args(["queue", "ack", "jobs", "--lease", "1", "--partition-id", "1", "--offset", "0",
                                "--error", "-x failed"])
    assert spaced.error == "-x failed"


# -- completion ------------------------------------------------------------------------------------


def completion_script(shell: str) -> str:
    done = subprocess.run([sys.executable, "-m", "queen", "completion", shell], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    return done.stdout


def installed(shell: str) -> str:
    path = shutil.which(shell)
    if path is None:
        message = f"SKIPPED LOUDLY: {shell} is not installed, so its completion script is not run (apt-get install {shell}; .ci/run does it)"
        print(message, file=sys.stderr)
        pytest.skip(message)
    return path


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_shells_script_knows_every_command_and_its_options(shell):
    script = completion_script(shell)
    for word in ("serve", "kv", "run-locked", "completion", "force-promote", "--ttl", "--if-absent", "--auth-token",
                 "--dlq-exit-code", "completed"):
        if shell == "fish" and word.startswith("--"):
            word = f"-l {word[2:]}"  # how fish names a long option
        assert word in script, (shell, word)


def test_the_bash_script_completes_commands_options_and_choices(tmp_path):
    script = tmp_path / "queen.bash"
    script.write_text(completion_script("bash"))
    for path_option in ("_shtab_queen_serve___data_dir_COMPGEN=_shtab_compgen_dirs",
                        "_shtab_queen_auth_add___auth_file_COMPGEN=_shtab_compgen_files"):
        assert path_option in script.read_text()  # a DIR or FILE completes as a path
    bash = installed("bash")
    assert subprocess.run([bash, "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    probe = f"""
        source {script}
        complete -p queen
        words() {{ COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}};
                   COMPREPLY=(); _shtab_queen queen "${{@: -1}}" "${{@: -2:1}}"; echo "${{COMPREPLY[*]}}"; }}
        words queen kv p
        words queen kv put --if
        words queen queue ack jobs --status ""
        words queen serve --log-format ""
        words queen serve --log-level ""
    """
    done = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    registered, command, option, choices, log_formats, log_levels = done.stdout.splitlines()
    assert registered.endswith(" queen")
    assert (command, option, choices) == ("put", "--if-absent", "completed failed dlq")
    assert (log_formats, log_levels) == ("logfmt json", "debug info warning error")


def test_the_zsh_script_is_a_compdef_function_zsh_reads(tmp_path):
    script = tmp_path / "_queen"
    script.write_text(completion_script("zsh"))
    assert script.read_text().startswith("#compdef queen")
    done = subprocess.run([installed("zsh"), "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")


def test_the_fish_script_completes_commands_options_and_choices(tmp_path):
    script = tmp_path / "queen.fish"
    script.write_text(completion_script("fish"))
    fish = installed("fish")
    assert subprocess.run([fish, "-n", str(script)], capture_output=True, timeout=30).returncode == 0

    def complete(line: str) -> list[str]:
        done = subprocess.run([fish, "--no-config", "-c", f"source {script}; complete -C '{line}'"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert complete("queen kv p") == ["put"]
    assert complete("queen kv put --if") == ["--if-absent"]
    assert complete("queen queue ack jobs --status ") == ["completed", "failed", "dlq"]
    assert complete("queen serve --log-format ") == ["logfmt", "json"]
    assert complete("queen serve --sync-mode ") == ["strict", "degrade"]


def test_serve_flags_with_a_fixed_set_of_values_take_only_those(capsys):
    from queen.cli import build_parser

    assert build_parser().parse_args(["serve", "--log-level", "WARNING"]).log_level == "warning"  # as logging has it
    message = usage_error(capsys, "serve", "--log-format", "jsn")
    assert "invalid choice: 'jsn'" in message and "logfmt" in message
