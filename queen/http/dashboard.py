"""The dashboard's static files (queen/dashboard/), served at / and /dashboard/<name> with no token.

They hold no data: the page's script asks for a token and calls the JSON API with it, so serving
them to anyone reveals nothing /healthz does not. Read once, when the API is built (at start, before
the event loop serves anyone): a few kilobytes that never change while the server runs.
"""

from __future__ import annotations

from importlib.resources import files

from queen.http.wire import Response

_TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
          ".css": b"text/css; charset=utf-8"}
# The page loads only its own files and talks only to this server; nothing may frame it.
_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                 b"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]


def load_assets() -> dict[str, Response]:
    """Path -> the answer for it: / is the page, /dashboard/<name> each of its files."""
    folder = files("queen") / "dashboard"
    assets = {}
    for entry in folder.iterdir():
        suffix = entry.name[entry.name.rfind("."):]
        if suffix in _TYPES:
            assets["/dashboard/" + entry.name] = Response(200, entry.read_bytes(), _TYPES[suffix], _HEADERS)
    assets["/"] = assets["/dashboard/index.html"]
    return assets
