"""The five stages. Each is a typed function of (validated params, paths) -> summary dict; the CLI, dvc.yaml and the
Prefect tasks are thin shells around these functions."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainflow.params import PipelineParams
    from trainflow.paths import Paths

STAGES = ("ingest", "split", "train", "evaluate", "register")


def importable(root: Path) -> None:
    """Put the project root first on sys.path, so model.name `mymodels:Net` imports ./mymodels.py without
    PYTHONPATH, whatever directory the process started in."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def arrow_memory() -> None:
    """Arrow's buffers from its jemalloc allocator, where this pyarrow build has one (Linux wheels do), instead of
    mimalloc. The streamed stages hand freed memory back after each column or block (`release_unused`): mimalloc then
    hands the next one fresh pages, which is slow, and kept more besides. Reading bench/out_of_core.py's 4M-row spill
    a column at a time, 3 times: 7.4 s and 726 MiB peak RSS with mimalloc, 3.3 s and 226 MiB with jemalloc."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name == "jemalloc":
        return
    with contextlib.suppress(NotImplementedError):  # a build without it (not Linux): Arrow's default stays
        pa.set_memory_pool(pa.jemalloc_memory_pool())


def run_stage(name: str, params: PipelineParams, paths: Paths, **options: Any) -> dict[str, Any]:
    """Run one stage by name: the single entry the CLI and the Prefect tasks share. `options`: the stage's own
    keyword arguments (ingest: accept_schema)."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; stages are {', '.join(STAGES)}")
    importable(paths.root)
    arrow_memory()
    module = importlib.import_module(f"trainflow.stages.{name}")
    result: dict[str, Any] = module.run(params, paths, **options)
    return result
