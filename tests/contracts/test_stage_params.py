"""Each stage takes only its params, and dvc.yaml's `params:` for it lists what it reads.

A stage module declares PARAMS (exactly its dvc.yaml `params:`) and READS_UNLISTED (what it reads that DVC must not
rerun it for, each with the reason); its `run` takes the top-level params those name as keywords and nothing else.
The stages are run here with params that record every field read, so a read the declarations miss (a rerun DVC would
skip) or a declaration nothing reads (a rerun for nothing) fails."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from support.projects import REPO

from trainflow.core.paths import Paths
from trainflow.params import PipelineParams, load_params, write_overrides
from trainflow.stages import STAGES, keywords, run_stage

# Keywords a stage's run takes that are not params: ingest's --accept-schema, and the params whole (`logged`) for a
# stage that records them (train's MLflow run, register's version tags).
OPTIONS = {"ingest": {"accept_schema"}}


def module(stage: str) -> Any:
    return importlib.import_module(f"trainflow.stages.{stage}")


def dvc_params() -> dict[str, list[str]]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {name: list(stage.get("params", [])) for name, stage in stages.items()}


@pytest.mark.parametrize("stage", STAGES)
def test_dvc_yaml_lists_exactly_the_params_the_stage_declares(stage: str) -> None:
    assert sorted(dvc_params()[stage]) == sorted(module(stage).PARAMS)
    for name in [*module(stage).PARAMS, *module(stage).READS_UNLISTED]:  # each names a real field
        node: Any = PipelineParams()
        for part in name.split("."):
            assert part in type(node).model_fields, f"{stage}: {name}"
            node = getattr(node, part)
    for name, why in module(stage).READS_UNLISTED.items():
        assert name not in module(stage).PARAMS and len(why) > 20, (stage, name)


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_takes_its_sections_as_keywords_and_never_the_whole_params(stage: str) -> None:
    signature = inspect.signature(module(stage).run)
    first, *rest = signature.parameters.values()
    assert first.name == "paths" and all(p.kind is p.KEYWORD_ONLY for p in rest)
    logged = {"logged"} if getattr(module(stage), "LOGS_PARAMS", False) else set()
    assert {p.name for p in rest} == set(keywords(module(stage))) | logged | OPTIONS.get(stage, set())
    # No function of a stage module takes PipelineParams: only the dispatcher (trainflow/stages/__init__.py) does.
    source = Path(module(stage).__file__).read_text()
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    assert "PipelineParams" not in names and "PipelineParams" not in source


def recording(model: BaseModel, path: str, reads: set[str]) -> BaseModel:
    """`model` as an instance of a subclass that adds the dotted path of every field read to `reads`: a nested
    section is followed down, and a dump or copy (which reads every field) counts as reading the section whole."""
    cls = type(model)
    fields = set(cls.model_fields)

    class Recording(cls):  # type: ignore[valid-type, misc]
        def __getattribute__(self, name: str) -> Any:
            if name in fields:
                value = object.__getattribute__(self, name)
                if isinstance(value, BaseModel):
                    return recording(value, f"{path}.{name}", reads)
                reads.add(f"{path}.{name}")
                return value
            if name in ("model_dump", "model_dump_json", "model_copy", "__iter__"):
                reads.add(path)
            return object.__getattribute__(self, name)

    Recording.__name__ = Recording.__qualname__ = cls.__name__
    return Recording.model_construct(_fields_set=model.model_fields_set, **dict(model))


def recorded(params: PipelineParams, reads: set[str]) -> PipelineParams:
    sections = {name: getattr(params, name) for name in type(params).model_fields}
    wrapped = {k: recording(v, k, reads) if isinstance(v, BaseModel) else v for k, v in sections.items()}
    return PipelineParams.model_construct(_fields_set=params.model_fields_set, **wrapped)


def covered(read: str, declared: list[str]) -> bool:
    """A read is covered by a declaration of it or of a section above it (`data` covers `data.source`)."""
    return any(read == d or read.startswith(d + ".") for d in declared)


def used(declared: str, reads: set[str]) -> bool:
    """A declaration is used when something at it, under it or above it is read (a dump of `train` reads
    `train.shuffle`)."""
    return any(r == declared or r.startswith(declared + ".") or declared.startswith(r + ".") for r in reads)


def test_the_stages_read_what_they_declare_and_nothing_else(csv_project: Path) -> None:
    """The five stages on a small table as configured by default, then register again with the setting that takes
    the other branch of what it reads (models-from-code is logged by register itself, into the experiment)."""
    paths = Paths(csv_project)
    reads: dict[str, set[str]] = {s: set() for s in STAGES}
    for overrides, stages in (([], STAGES), (["register.flavor=code"], ("register",))):
        write_overrides(paths.params, overrides)
        for stage in stages:
            seen: set[str] = set()
            run_stage(stage, recorded(load_params(paths.params), seen), paths)
            reads[stage] |= seen
    for stage in STAGES:
        m = module(stage)
        declared = [*m.PARAMS, *m.READS_UNLISTED]
        # a top-level value (seed) is handed over whole, so a stage that takes one reads it
        read = reads[stage] | {k for k in keywords(m) if not isinstance(getattr(PipelineParams(), k), BaseModel)}
        unlisted = sorted(r for r in read if not covered(r, declared))
        assert not unlisted, f"{stage} reads {unlisted}: list them in PARAMS (and dvc.yaml) or READS_UNLISTED"
        unread = sorted(d for d in declared if not used(d, read))
        assert not unread, f"{stage} declares {unread} but never reads them"
