"""The import paths of modules that moved in 0.2 (the layers: core, artifacts, registry), kept for one release.

A user's own code (`model.code`, a script beside the project) may import `trainflow.errors` or
`trainflow.predict`; those names still import, as the very module at its new path, with a DeprecationWarning that
gives the new name. trainflow's own code and tests never use them: lint bans them (pyproject.toml, banned-api), so a
`monkeypatch.setattr` cannot silently patch a shim. `trainflow.registry` (now a package) and `trainflow.report`'s
old attributes have no shim: no model code reaches them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

MOVED = {
    "trainflow.errors": "trainflow.core.errors",
    "trainflow.io": "trainflow.core.io",
    "trainflow.paths": "trainflow.core.paths",
    "trainflow.workspace": "trainflow.core.workspace",
    "trainflow.processes": "trainflow.core.processes",
    "trainflow.engine.progress": "trainflow.core.progress",
    "trainflow.engine.data": "trainflow.engine.loaders",
    "trainflow.arrival": "trainflow.data.arrival",
    "trainflow.fingerprint": "trainflow.engine.fingerprint",
    "trainflow.export": "trainflow.artifacts.export",
    "trainflow.onnx_export": "trainflow.artifacts.onnx",
    "trainflow.predict": "trainflow.artifacts.predict",
    "trainflow.batch": "trainflow.artifacts.batch_predict",
    "trainflow.manifest": "trainflow.artifacts.manifest",
    "trainflow.gate": "trainflow.registry.gate",
    "trainflow.card": "trainflow.registry.card",
    "trainflow.why": "trainflow.registry.changes",
    "trainflow.lineage": "trainflow.registry.lineage",
    "trainflow.verify": "trainflow.registry.verify",
    "trainflow.report": "trainflow.stages.report",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: asked only for a name no real module has."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is now {new}; the old name stops working in trainflow 0.3", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the module at the new path is whole already


def install() -> None:
    if not any(isinstance(f, MovedModules) for f in sys.meta_path):
        sys.meta_path.append(MovedModules())
