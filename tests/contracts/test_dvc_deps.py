"""Each dvc.yaml stage depends on exactly the project modules that stage imports, so changing one reruns the stages that
use it, and only those.

Two independent views of "what a stage imports": Python's own (the project modules in `sys.modules` after importing
the stage in a fresh interpreter, forked from one that only preloaded third-party packages) and a static one (every
import statement reachable from the stage module, including imports inside functions, which Python only runs when the
function does). dvc.yaml must list every module of both, and nothing else.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.projects import committed

from trainflow.stages import STAGES

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "trainflow"
# Deps a stage has without importing them. With register.flavor code, register stores serving_code.py (by path) and
# what it imports as the registered model's code; the default flavour stores none (its loader is the installed
# package's trainflow.serving, so a change there changes no output).
NOT_IMPORTED = {"register": {"trainflow/serving.py", "trainflow/serving_code.py"}}


def module_file(name: str) -> Path | None:
    path = REPO / Path(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def imported_names(file: Path, package: str) -> set[str]:
    """Every module name an import statement anywhere in `file` may load (`from a import b` may be module a.b)."""
    names = set()
    for node in _runnable(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return names


def _runnable(tree: ast.AST) -> list[ast.AST]:
    """The nodes of `tree` but those under `if TYPE_CHECKING:` (imports for annotations, which never run)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            children = node.orelse
        todo += children
    return out


def static_closure(module: str) -> set[str]:
    """Files of the project modules reachable from `module` through import statements (and their packages)."""
    found: dict[str, Path] = {}
    todo = [module]
    while todo:
        parts = todo.pop().split(".")
        if parts[0] != PACKAGE:
            continue
        for i in range(1, len(parts) + 1):  # importing a.b.c imports a and a.b first
            name = ".".join(parts[:i])
            file = module_file(name)
            if file is None or name in found:
                continue
            found[name] = file
            todo += imported_names(file, name if file.name == "__init__.py" else name.rsplit(".", 1)[0])
    return {f.relative_to(REPO).as_posix() for f in found.values()}


# Third-party packages the stages import, imported once before the per-stage forks (below) instead of once per stage:
# seconds each. Preloading them can only add project modules to what a stage loads (none do: checked), never remove
# any, so it can hide no import from the checks below.
PRELOAD = ("numpy", "pandas", "pyarrow", "pydantic", "yaml", "torch", "safetensors", "tokenizers")
FORKED = """
import importlib, json, os, sys, traceback
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
package = sys.argv[2]
assert not [n for n in sys.modules if n.split(".")[0] == package], "a preloaded package imported the project"
for module in sys.argv[3:]:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # a copy of this interpreter that has imported nothing of the project yet
        try:
            importlib.import_module(module)
            mods = list(sys.modules.items())
            files = [m.__file__ for n, m in mods if n.split(".")[0] == package and getattr(m, "__file__", None)]
            print(json.dumps([module, files]), flush=True)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        sys.exit(f"importing {module} failed (status {status})")
"""


@functools.cache
def _loaded() -> dict[str, set[str]]:
    """For each stage module, the project files in `sys.modules` after importing it in an interpreter that had imported
    none of them: one process per stage, forked from one that preloaded the heavy third-party packages."""
    modules = [f"{PACKAGE}.stages.{stage}" for stage in STAGES]
    args = [sys.executable, "-c", FORKED, json.dumps(PRELOAD), PACKAGE, *modules]
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=True).stdout
    found = dict(json.loads(line) for line in out.splitlines() if line.startswith("["))
    assert sorted(found) == sorted(modules), out
    return {m: {Path(f).resolve().relative_to(REPO).as_posix() for f in files} for m, files in found.items()}


def loaded_in_fresh_interpreter(module: str) -> set[str]:
    return _loaded()[module]


def interpolated(dep: str) -> str:
    """`${model.code}` as DVC reads it: the value at that dotted key of params.yaml."""
    params = yaml.safe_load(committed("params.yaml")["params.yaml"])

    def value(match: re.Match[str]) -> str:
        node = params
        for key in match.group(1).split("."):
            node = node[key]
        return str(node)

    return re.sub(r"\$\{([\w.]+)\}", value, dep)


def declared_code(stage: str) -> set[str]:
    """The .py files under trainflow/ that the stage's deps name (a directory names every file in it)."""
    deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]["deps"]
    files: set[str] = set()
    for dep in map(interpolated, deps):
        path = REPO / dep
        if not dep.startswith(f"{PACKAGE}/"):
            continue
        assert path.exists(), f"dvc.yaml: {stage} depends on {dep}, which does not exist"
        found = [path] if path.is_file() else [p for p in path.rglob("*.py") if "__pycache__" not in p.parts]
        files |= {p.relative_to(REPO).as_posix() for p in found}
    return files


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_deps_are_exactly_the_modules_the_stage_imports(stage: str) -> None:
    module = f"{PACKAGE}.stages.{stage}"
    loaded = loaded_in_fresh_interpreter(module)
    reachable = static_closure(module)
    assert loaded <= reachable, f"imports the static scan missed: {sorted(loaded - reachable)}"
    declared = declared_code(stage)
    expected = reachable | NOT_IMPORTED.get(stage, set())
    assert not expected - declared, f"dvc.yaml: stage {stage} is missing deps {sorted(expected - declared)}"
    assert not declared - expected, f"dvc.yaml: stage {stage} lists deps it never uses: {sorted(declared - expected)}"


def test_the_static_scan_sees_imports_inside_functions() -> None:
    """train builds the text transformer through a function-level import, which importing the stage does not run."""
    assert "trainflow/models/text.py" not in loaded_in_fresh_interpreter("trainflow.stages.train")
    assert "trainflow/models/text.py" in static_closure("trainflow.stages.train")


def test_the_train_stage_depends_on_the_model_code_param() -> None:
    """A user model's module (`-S model.code=mymodels`) is a train dep through `${model.code}`, so editing it reruns
    train; the default names trainflow's own models, which the stage imports anyway."""
    deps = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]["deps"]
    assert "${model.code}" in deps
    assert interpolated("${model.code}") == yaml.safe_load(committed("params.yaml")["params.yaml"])["model"]["code"]
