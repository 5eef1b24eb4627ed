"""Which build of the hot modules this process runs: compiled by mypyc, or the same .py files.

setup.py compiles MODULES with mypyc where a C compiler is present (the extension lands beside the
.py, and Python's import prefers it) and writes BUILD_FILE beside this file: each module's source
hash at build time. queen/__init__.py imports this module first, so the choice is made before any
of MODULES is imported, all or nothing (compiled modules call each other directly, so a mix is
never loaded):
  - no extension present (QUEEN_PURE=1 at build time, no compiler): the .py files, compiled=false;
  - QUEEN_PURE=1 in the environment at run time: the .py files even where extensions exist;
  - an extension whose .py changed since it was built (an edited checkout): the .py files, and one
    line on stderr saying so: a stale extension never runs in place of edited source;
  - otherwise the extensions, compiled=true.
`queen serve` logs the outcome and /metrics carries it in queen_build_info{compiled=...}.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys

# Compiled by setup.py (which reads this tuple from this file's text: keep it a literal).
MODULES = (
    "queen.core.kv",
    "queen.core.sorted_keys",
    "queen.core.locks",
    "queen.core.values",
    "queen.core.wheel",
    "queen.core.packing",
    "queen.http.wire",
    "queen.core.queue_ops",
    "queen.core.txn",
    "queen.core.queues.model",
    "queen.core.queues.packed",
    "queen.core.queues.parking",
    "queen.core.queues.delivery",
    "queen.core.queues.table",
)
BUILD_FILE = "_native_build.json"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_path(module: str, root: str = _ROOT) -> str:
    return os.path.join(root, *module.split(".")) + ".py"


def source_hash(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def _extension(module: str) -> str | None:
    base = source_path(module)[: -len(".py")]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(base + suffix):
            return base + suffix
    return None


def _decide() -> tuple[bool, str]:
    """(compiled, why)."""
    present = [module for module in MODULES if _extension(module) is not None]
    if not present:
        return False, "pure build"
    if os.environ.get("QUEEN_PURE", "") not in ("", "0"):
        return False, "QUEEN_PURE is set"
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), BUILD_FILE)) as file:
            built = json.load(file)
    except (OSError, ValueError):
        built = {}
    stale = [module for module in MODULES
             if module not in present or built.get(module) != source_hash(source_path(module))]
    if stale:
        print(f"queen: running the pure-Python core: {', '.join(stale)} changed since the compiled build "
              f"(or was not compiled); reinstall (pip install -e .) to compile it again", file=sys.stderr)
        return False, "stale build"
    return True, "compiled"


class _SourceFirst:
    """A meta path finder that loads MODULES from their .py files, ahead of the extensions."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name not in MODULES:
            return None
        return importlib.util.spec_from_file_location(name, source_path(name))


COMPILED, WHY = _decide()
if not COMPILED and WHY != "pure build":
    sys.meta_path.insert(0, _SourceFirst())
