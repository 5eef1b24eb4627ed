"""`queen cluster status|switchover|force-promote`: a cluster's nodes, asked over HTTP.

--url may list several nodes (comma-separated). `status` asks every one and prints a table;
switchover goes to the leader (found through the nodes, following their 307); force-promote goes
to the first node that answers. Plain http.client: these are one-off operator calls, and the
command works where the SDK is not installed.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
from urllib.parse import urlsplit

from queen.cli.output import EXIT_NO, EXIT_OK, EXIT_REJECTED, EXIT_UNAVAILABLE, EXIT_USAGE

DEFAULT_URL = "http://127.0.0.1:6632"
STATUS_EXIT = ("; a line on stderr says what is wrong. Exit status: 0 a leader serves with its sync set full and "
               "in reach; 1 nodes answered but none serves as leader, or the leader is degraded (its sync set has "
               "fewer members than it wants: writes are acknowledged on fewer copies); 2 usage; 69 no node "
               "answered, or the leader's sync set is out of reach (writes answer 503 sync_unavailable)")


def add_parser(commands) -> None:
    cluster = commands.add_parser(
        "cluster", help="a cluster's nodes: status, switchover, force-promote",
        description="Ask a cluster's nodes. Exit status: 0 done, 1 refused (409: not possible now; for status: "
                    "see `queen cluster status --help`), 2 usage, 65 rejected (400/403), 69 no node answered or "
                    "503.")
    actions = cluster.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    common = []
    for name, text in (("status", "every node's role, epoch, last version and lag, as a table"),
                       ("switchover", "hand leadership to a caught-up follower (planned, about a second)"),
                       ("force-promote", "make NODE leader though no sync member is left: writes it never "
                                         "received are lost (the answer says how many versions may be)")):
        action = actions.add_parser(name, help=text, description=text + (STATUS_EXIT if name == "status" else ""))
        action.add_argument("--url", default=None, metavar="URLS",
                            help=f"nodes, comma-separated [env QUEEN_URL] (default: {DEFAULT_URL})")
        action.add_argument("--auth-token", default=None, metavar="SECRET", dest="auth_token",
                            help="the operator's API token [env QUEEN_TOKEN]")
        action.add_argument("--ca-file", default=None, metavar="FILE", help="the CA of https nodes [env QUEEN_CA_FILE]")
        action.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default: 10)")
        action.add_argument("--json", action="store_true", help="print the answers as JSON")
        common.append(action)
    common[1].add_argument("--to", default=None, metavar="NODE", help="the node to hand over to (default: the most "
                                                                      "caught-up follower)")
    common[2].add_argument("node", metavar="NODE", help="the node to promote")
    for action, run in zip(common, (run_status, run_switchover, run_force_promote), strict=True):
        action.set_defaults(run=run)


def _urls(args) -> list[str]:
    raw = args.url or os.environ.get("QUEEN_URL") or DEFAULT_URL
    return [url.strip().rstrip("/") for url in raw.split(",") if url.strip()]


def call(args, url: str, method: str, path: str, body: dict | None = None, redirects: int = 2):
    """(status, document) of one call; follows a node's 307 to the leader a couple of times."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        ca_file = args.ca_file or os.environ.get("QUEEN_CA_FILE")
        context = ssl.create_default_context(cafile=ca_file)
        connection = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=args.timeout,
                                                 context=context)
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=args.timeout)
    headers = {"accept": "application/json"}
    token = args.auth_token if args.auth_token is not None else os.environ.get("QUEEN_TOKEN")
    if token:
        headers["authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["content-type"] = "application/json"
    try:
        connection.request(method, path, data, headers)
        answer = connection.getresponse()
        raw = answer.read()
        location = answer.getheader("location")
    finally:
        connection.close()
    if answer.status == 307 and location and redirects > 0:
        target = urlsplit(location)
        return call(args, f"{target.scheme}://{target.netloc}", method, path, body, redirects - 1)
    try:
        document = json.loads(raw) if raw else {}
    except ValueError:
        document = {"code": "not_json", "detail": raw[:200].decode(errors="replace")}
    return answer.status, document


def refusal(document, status: int) -> tuple[str, str]:
    """A refusal's code and message: the envelope's `code` and `detail` (older nodes send them too)."""
    if not isinstance(document, dict):
        return str(status), ""
    return str(document.get("code", status)), str(document.get("detail", ""))


def _exit_for(status: int) -> int:
    if status == 200:
        return EXIT_OK
    if status == 409:
        return EXIT_NO
    if status in (400, 401, 403, 404):
        return EXIT_REJECTED
    return EXIT_UNAVAILABLE


def _first_answer(args, method: str, path: str, body: dict | None):
    """The first node that answers (any status but a transport failure or 503)."""
    failures = []
    for url in _urls(args):
        try:
            status, document = call(args, url, method, path, body)
        except (OSError, http.client.HTTPException) as error:
            failures.append(f"{url}: {error}")
            continue
        if status == 503:
            failures.append(f"{url}: {refusal(document, status)[0]}")
            continue
        return status, document
    print("queen: no node answered: " + "; ".join(failures), file=sys.stderr)
    return None, None


def _report(args, status: int, document: dict) -> int:
    if status != 200:
        code, message = refusal(document, status)
        print(f"queen: {code}: {message}", file=sys.stderr)
        return _exit_for(status)
    print(json.dumps(document, indent=None if args.json else 2, sort_keys=True))
    return EXIT_OK


def run_status(args) -> int:
    rows = []
    answered = 0
    for url in _urls(args):
        try:
            status, document = call(args, url, "GET", "/api/v1/cluster", redirects=0)
        except (OSError, http.client.HTTPException) as error:
            rows.append({"url": url, "error": str(error)})
            continue
        if status != 200:
            rows.append({"url": url, "error": refusal(document, status)[0]})
            continue
        answered += 1
        rows.append({"url": url, **document})
    if args.json:
        print(json.dumps(rows, sort_keys=True))
    else:
        print(format_table(rows))
    if not answered:
        return EXIT_UNAVAILABLE
    leader = next((row for row in rows if row.get("role") in ("leader", "single")), None)
    if leader is None:
        # A script polling until the cluster serves again needs to tell this from a healthy table.
        print("queen: no node serves as leader (an election, etcd out of reach, or a new leader waiting for "
              "its sync set: see ROLE and each node's log)", file=sys.stderr)
        return EXIT_NO
    sync = ", ".join(leader.get("sync") or ()) or "none"
    if leader.get("syncUnavailable"):
        print(f"queen: sync_unavailable: the leader {leader.get('node')} cannot reach its sync set ({sync}): writes "
              "answer 503 sync_unavailable until it is back (start it again, or see its log)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if leader.get("degraded"):
        print(f"queen: degraded: the leader {leader.get('node')} acknowledges writes with a short sync set ({sync}): "
              "fewer copies than wanted, until a follower catches up and joins", file=sys.stderr)
        return EXIT_NO
    return EXIT_OK


def format_table(rows: list[dict]) -> str:
    """One line per node: node, role, epoch, last version, lag (as its leader reports it), url."""
    lag = {}
    for row in rows:
        for follower in row.get("followers") or ():
            lag[follower["node"]] = follower["lagVersions"]
    lines = [("NODE", "ROLE", "EPOCH", "LAST VERSION", "LAG", "SYNC", "URL")]
    for row in rows:
        if "error" in row:
            lines.append(("?", "unreachable" if " " in row["error"] else row["error"], "-", "-", "-", "-", row["url"]))
            continue
        node = row.get("node") or "-"
        is_sync = "yes" if node in (row.get("sync") or ()) else ("leader" if row.get("role") == "leader" else "")
        lines.append((node, row.get("role", "?"), str(row.get("epoch", 0)), str(row.get("lastVersion", "-")),
                      str(lag.get(node, 0 if row.get("role") == "leader" else "-")), is_sync or "-", row["url"]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def run_switchover(args) -> int:
    status, document = _first_answer(args, "POST", "/api/v1/cluster/switchover", {"to": args.to} if args.to else {})
    if status is None:
        return EXIT_UNAVAILABLE
    return _report(args, status, document)


def run_force_promote(args) -> int:
    if not args.node:
        print("queen: name the node to promote", file=sys.stderr)
        return EXIT_USAGE
    status, document = _first_answer(args, "POST", "/api/v1/cluster/force-promote", {"node": args.node})
    if status is None:
        return EXIT_UNAVAILABLE
    code = _report(args, status, document)
    if status == 200 and document.get("mayBeLost"):
        print(f"queen: warning: up to {document['mayBeLost']} versions the old leader acknowledged may be lost",
              file=sys.stderr)
    return code
