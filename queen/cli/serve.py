"""`queen serve`: the broker. Settings resolve once, here: flags over QUEEN_* variables over the
defaults (queen/config.py), then the server runs until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import textwrap

from queen.auth import AuthFileError
from queen.cli.check import EXIT_REFUSED, server_dependencies_missing
from queen.config import CHOICES, Config, config_fields, validate
from queen.errors import CorruptLog, RefusedToStart, VersionsExhausted
from queen.logs import LineFormatter

logger = logging.getLogger("queen")

# Exit statuses. The two refusals a restart cannot cure have their own, so a service manager can
# tell them from a crash and stop retrying (systemd: RestartPreventExitStatus=, ops/queen.service).
EXIT_FAILED = 1  # anything else that stopped it: a port in use, a bad certificate or auth file, ...
EXIT_USAGE = 2
EXIT_DATA_REFUSED = EXIT_REFUSED  # 4, as `queen check` says of the same directory
EXIT_DATA_DIR_IN_USE = 5

EXIT_STATUS_HELP = f"""\
exit status:
  0  stopped by SIGTERM or SIGINT, everything acknowledged on disk
  {EXIT_FAILED}  failed to start or run (a port in use, an unusable auth file or certificate, ...)
  {EXIT_USAGE}  usage: a bad flag, variable or setting
  {EXIT_DATA_REFUSED}  recovery refuses the data directory: a corrupt log (serving it would drop
     acknowledged writes), another format version, or versions used up; `queen check` says the same
  {EXIT_DATA_DIR_IN_USE}  the data directory is in use: another server holds its lock
Each refusal is one log line, event=start_failed reason=..., naming what to look at.
"""


ADDRESS_IN_USE_HINT = ("another process listens there: stop it, or give another port (--port; --port 0 picks a free "
                       "one, and --port-file says which)")

# The cluster flags' short spellings, beside the names derived from their fields.
FLAG_ALIASES = {"node_id": ("--node",), "leader_ttl_s": ("--leader-ttl",), "lease_grace_s": ("--lease-grace",),
                "sync_timeout_s": ("--sync-timeout",)}


def env_name(field_name: str) -> str:
    return "QUEEN_" + field_name.upper()


def add_parser(commands) -> None:
    serve = commands.add_parser(
        "serve", help="run the broker",
        description=textwrap.fill("Run the broker. Every setting can also come from the QUEEN_* variable named "
                    "beside it; a flag wins over the variable, the variable over the default. Under a service "
                    "manager that sets NOTIFY_SOCKET (systemd Type=notify) it reports READY=1 once it listens, "
                    "after recovery, and STOPPING=1 at SIGTERM."),
        epilog=EXIT_STATUS_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, kind, default, help_text, metavar in config_fields():
        if kind == "bool":
            serve.add_argument("--" + name.replace("_", "-"), dest=name, default=None, action="store_const",
                               const=True, help=f"{help_text} [env {env_name(name)}=1]")
            continue
        # A fixed set of values is the flag's choices (tab completion offers them); a log level in
        # capitals (INFO) is the level still, as logging has it.
        serve.add_argument("--" + name.replace("_", "-"), *FLAG_ALIASES.get(name, ()), dest=name, default=None,
                           metavar=metavar, choices=CHOICES.get(name),
                           type=str.lower if name == "log_level" else {"int": int, "float": float}.get(kind, str),
                           help=f"{help_text} [env {env_name(name)}] (default: {default if default != '' else 'none'})")
    serve.set_defaults(run=lambda args: serve_broker(resolve_config(args)))


def resolve_config(args: argparse.Namespace, environ=os.environ) -> Config:
    values = {}
    for name, kind, _, _, _ in config_fields():
        value = getattr(args, name, None)
        if value is None and env_name(name) in environ:
            raw = environ[env_name(name)]
            try:
                value = {"int": int, "float": float, "bool": _flag}.get(kind, str)(raw)
            except ValueError:
                print(f"queen: {env_name(name)}={raw!r} is not a valid {kind}", file=sys.stderr)
                raise SystemExit(EXIT_USAGE) from None
        if value is not None:
            values[name] = value
    return Config(**values)


def _flag(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def setup_logging(level: str, kind: str = "logfmt", access_log: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(kind))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    if access_log:
        # Asked for by its own flag: shown even when --log-level hides the other info lines.
        logging.getLogger("queen.access").setLevel(logging.INFO)


def serve_broker(config: Config) -> int:
    problems = validate(config)
    if problems:
        for problem in problems:
            print(f"queen: {problem}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(config.log_level, config.log_format, config.access_log)
    try:
        import trio

        from queen.http.tls import TlsSetupError
        from queen.runtime.notify import Notifier
        from queen.runtime.port_file import PortFileError
        from queen.runtime.server import AddressInUse, DataDirBusy, Server, settle_collector
    except ModuleNotFoundError as missing:
        return server_dependencies_missing("serve", missing)

    # Everything imported so far lives as long as the process: out of the cyclic GC's sight, a
    # full collection walks only what the server builds, not the modules under it.
    settle_collector()
    server = Server(config, notifier=Notifier.from_environ())

    async def watch_signals():
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async for signum in signals:
                logger.info("event=signal signal=%s", signal.Signals(signum).name)
                if signum == signal.SIGHUP:
                    server.reload()
                else:
                    server.request_shutdown()

    async def main_task():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_signals)
            await server.run()
            nursery.cancel_scope.cancel()

    failure = None
    try:
        trio.run(main_task)
    except* (DataDirBusy, RefusedToStart, OSError, TlsSetupError, AuthFileError, AddressInUse,
             PortFileError) as group:  # raised inside nurseries, so grouped
        failure = _first_leaf(group)
    if failure is None:
        return 0
    if isinstance(failure, DataDirBusy):
        logger.error("event=start_failed reason=data_dir_in_use detail=%r action=refusing_to_start", str(failure))
        return EXIT_DATA_DIR_IN_USE
    if isinstance(failure, RefusedToStart):
        _log_refusal(failure)
        return EXIT_DATA_REFUSED
    if isinstance(failure, TlsSetupError):
        logger.error("event=start_failed reason=tls file=%s error=%r action=refusing_to_start", failure.path, failure.detail)
    elif isinstance(failure, AuthFileError):
        logger.error("event=start_failed reason=auth_file detail=%r action=refusing_to_start", str(failure))
    elif isinstance(failure, AddressInUse):
        logger.error("event=start_failed reason=address_in_use host=%s port=%d hint=%r", failure.host, failure.port,
                     ADDRESS_IN_USE_HINT)
    elif isinstance(failure, PortFileError):
        logger.error("event=start_failed reason=port_file file=%s detail=%r action=refusing_to_start", failure.path,
                     failure.detail)
    elif isinstance(failure, OSError) and failure.errno == errno.EADDRINUSE:  # listen(): taken since the bind
        logger.error("event=start_failed reason=address_in_use host=%s port=%d hint=%r", config.host, config.port,
                     ADDRESS_IN_USE_HINT)
    else:
        logger.error("event=start_failed reason=%r", str(failure))
    return EXIT_FAILED


def _log_refusal(failure: RefusedToStart) -> None:
    if isinstance(failure, CorruptLog):
        logger.error("event=start_failed reason=corrupt_log detail=%r action=refusing_to_start "
                     "hint='inspect or move the named file; starting would drop acknowledged writes'", str(failure))
    elif isinstance(failure, VersionsExhausted):
        logger.error("event=start_failed reason=versions_exhausted detail=%r action=refusing_to_start", str(failure))
    else:
        logger.error("event=start_failed reason=unreadable_format detail=%r action=refusing_to_start", str(failure))


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
