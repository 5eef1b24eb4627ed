"""Compiles the hot modules (queen/_native.py, MODULES) with mypyc where a C compiler and Python's
headers are present; everything else about the package is in pyproject.toml. Without a compiler,
without mypy, or with QUEEN_PURE=1, the build prints one line saying so and installs the same .py
files, which then run as they are: there is one source of truth and no second implementation."""

import ast
import hashlib
import json
import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def say(message):
    print(f"queen: {message}", file=sys.stderr, flush=True)


def compiled_modules():
    """MODULES from queen/_native.py, read as text: the package's dependencies may not be installed."""
    with open(os.path.join(HERE, "queen", "_native.py")) as file:
        tree = ast.parse(file.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [target.id for target in node.targets] == ["MODULES"]:
            return ast.literal_eval(node.value)
    raise SystemExit("setup.py: no MODULES in queen/_native.py")


def source(module):
    return os.path.join("queen", *module.split(".")[1:]) + ".py"


class BuildExtOrPure(build_ext):
    """build_ext that falls back to no extensions at all when compiling fails (no compiler, no
    headers), and records each compiled module's source hash for queen/_native.py."""

    def run(self):
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as error:  # CompileError, LinkError, a missing compiler: all mean pure
            say(f"compiling the core failed ({type(error).__name__}: {str(error)[:120]}...); installing pure Python")
            self.extensions = []
            self._remove_partial_outputs()
            return
        hashes = {}
        for module in compiled_modules():
            with open(os.path.join(HERE, source(module)), "rb") as file:
                hashes[module] = hashlib.sha256(file.read()).hexdigest()
        for root in {self.build_lib, HERE} if self.inplace else {self.build_lib}:
            path = os.path.join(root, "queen", "_native_build.json")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as file:
                json.dump(hashes, file, indent=1, sort_keys=True)
        say(f"compiled {len(hashes)} core modules with mypyc")

    def _remove_partial_outputs(self):
        for path in self.get_outputs():
            if os.path.exists(path):
                os.remove(path)

    def get_outputs(self):
        return super().get_outputs() if self.extensions else []


def ext_modules():
    # pip runs this file three times (requirements, metadata, the wheel): only the wheel's run
    # needs the extensions, and mypyc's type check takes seconds.
    if not {"bdist_wheel", "editable_wheel", "build_ext", "build", "install", "develop"} & set(sys.argv[1:]):
        return []
    if os.environ.get("QUEEN_PURE", "") not in ("", "0"):
        say("QUEEN_PURE is set: installing the pure-Python core")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as error:
        say(f"mypyc is not importable ({error}); installing the pure-Python core")
        return []
    sources = [source(module) for module in compiled_modules()]
    try:
        return mypycify(sources, opt_level="3", group_name="queen_native")
    except SystemExit as error:  # mypy found a type error: that is ours to fix, not the user's
        say(f"mypyc refused the core (exit {error.code}); installing the pure-Python core")
        return []


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExtOrPure})
