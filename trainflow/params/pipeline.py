"""The whole params.yaml: its sections together, overrides (`-S key=value`), loading, validating and writing back."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from trainflow.core.errors import ParamsError
from trainflow.params.base import Section
from trainflow.params.data import DataParams, default_model_name, source_outside
from trainflow.params.deploy import DeployParams
from trainflow.params.evaluate import EvaluateParams
from trainflow.params.features import FeatureParams
from trainflow.params.model import ModelParams
from trainflow.params.register import RegisterParams
from trainflow.params.split import SplitParams
from trainflow.params.tracking import TrackingParams
from trainflow.params.train import TrainParams
from trainflow.params.tune import TuneParams

# `register` is a stage name here, not ABCMeta.register; pydantic warns about the shadowing, harmlessly.
warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)


class PipelineParams(Section):
    seed: int = Field(
        42,
        ge=0,
        description="The training seed: initialisation, data order, augmentation and the paired gate's permutations. "
        "It does not move rows between splits (split.seed does).",
    )
    data: DataParams = Field(default_factory=DataParams, description="Raw data source and schema (ingest).")  # type: ignore[arg-type]
    features: FeatureParams = Field(default_factory=FeatureParams, description="Preprocessing fitted on train (train).")  # type: ignore[arg-type]
    split: SplitParams = Field(default_factory=SplitParams, description="Train/val/test split (split).")  # type: ignore[arg-type]
    model: ModelParams = Field(default_factory=ModelParams, description="Model architecture (train).")  # type: ignore[arg-type]
    train: TrainParams = Field(default_factory=TrainParams, description="Training loop (train).")  # type: ignore[arg-type]
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams, description="Test scoring (evaluate).")  # type: ignore[arg-type]
    register: RegisterParams = Field(default_factory=RegisterParams, description="Model registry (register).")  # type: ignore[arg-type]
    tracking: TrackingParams = Field(default_factory=TrackingParams, description="MLflow tracking.")  # type: ignore[arg-type]
    deploy: DeployParams = Field(default_factory=DeployParams, description="Scheduled retraining (no stage).")  # type: ignore[arg-type]
    tune: TuneParams = Field(default_factory=TuneParams, description="Hyperparameter sweeps (no stage).")  # type: ignore[arg-type]

    def sections(self, names: Iterable[str]) -> dict[str, Any]:
        """{name: its value} of the named top-level params: what the dispatcher hands a stage (its keywords), so
        that a stage's signature shows what it may read. The one place a stage's params are picked out of the
        whole."""
        unknown = [n for n in names if n not in type(self).model_fields]
        if unknown:
            raise ValueError(f"no top-level params named {', '.join(unknown)}")
        return {n: getattr(self, n) for n in names}

    @model_validator(mode="after")
    def _model_name(self) -> PipelineParams:
        """register.model_name auto becomes the name of the data, so that new data is registered under its own name."""
        if self.register.model_name == "auto":
            task = None if self.data.task == "auto" else self.data.task
            self.register.model_name = default_model_name(self.data.source, self.data.target, task)
        return self

    @model_validator(mode="after")
    def _space_values(self) -> PipelineParams:
        """Every bound and choice of tune.space is a valid value of its param, beside the other params as they are
        (a sampled value lies between or among them, so trials do not fail on invalid params)."""
        problems = []
        for path, dim in self.tune.space.items():
            section, _, field = path.partition(".")
            current: Section = getattr(self, section)
            for value in dim.values_to_check():
                raw = current.model_dump()
                _set(raw, field.split("."), value)
                try:
                    type(current).model_validate(raw)
                except ValidationError as exc:
                    why = "; ".join(msg for _, msg in _problems(exc))
                    problems.append(f"tune.space.{path}: {value!r} is not a valid value ({why})")
        if problems:
            raise ValueError("\n".join(problems))  # one problem per line, each reported with its own path
        return self


# --- overrides -------------------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.lr=3e-4` -> (["train", "lr"], 0.0003). The value is YAML, as in `dvc exp run -S`."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ParamsError("-S", [(text, "an override must look like key.subkey=value, e.g. -S train.lr=3e-4")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ParamsError("-S", [(key, f"value {raw!r} is not valid YAML: {exc}")]) from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each dotted key in a copy of `raw`; unknown keys are left for validation to report."""
    import copy

    out = copy.deepcopy(raw)
    for text in overrides:
        _set(out, *parse_override(text))
    return out


def _set(node: dict[str, Any], keys: list[str], value: Any) -> None:
    for k in keys[:-1]:
        child = node.get(k)
        if not isinstance(child, dict):
            child = {}
            node[k] = child
        node = child
    node[keys[-1]] = value


def with_values(params: PipelineParams, values: dict[str, Any], source: str) -> PipelineParams:
    """`params` with each dotted path set to its value, validated (ParamsError naming `source` otherwise)."""
    raw = params.model_dump(mode="json")
    for path, value in values.items():
        _set(raw, path.split("."), value)
    return validate(raw, source)


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown parameter (check the spelling; `trainflow params schema` lists the valid ones)"
        elif "input" in err and not isinstance(err["input"], dict):
            msg = f"{msg} (got {err['input']!r})"
        elif LOCATED.match(msg):  # a validator's list of "dotted.path: problem" lines (tune.space)
            problems += [(line.split(": ", 1)[0], line.split(": ", 1)[1]) for line in msg.splitlines()]
            continue
        problems.append((path or "<root>", msg))
    return problems


LOCATED = re.compile(r"^(tune\.space\.\S+: .+\n?)+$")


# libyaml's parser where PyYAML was built with it (its wheels are): params.yaml is read by every stage and command,
# and PyYAML's pure-Python parser is an order of magnitude slower. Same resolver and constructor.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose(text: str) -> tuple[yaml.Node | None, yaml.SafeLoader]:
    """The document's node tree, and the loader that made it (to construct the values from it: one parse)."""
    loader = _LOADER(text)
    try:
        return loader.get_single_node(), loader
    finally:
        loader.dispose()


def duplicate_keys(text: str) -> list[tuple[str, str]]:
    """Every key given twice in one mapping, as (dotted path, where): YAML forbids them, PyYAML silently keeps the
    last one (so `params check` passed), and DVC refuses the whole file with a traceback."""
    return _duplicates(_compose(text)[0])


def _duplicates(root: yaml.Node | None) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for key_node, value in node.value:
                key, line = str(key_node.value), key_node.start_mark.line + 1
                dotted = f"{path}.{key}" if path else key
                if key in first:
                    problems.append((dotted, f"given twice (lines {first[key]} and {line}); keep one of them"))
                first.setdefault(key, line)
                walk(value, dotted)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    if root is not None:
        walk(root, "")
    return problems


def read_raw(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ParamsError(str(path), [("<file>", "file not found; run from the project root or create params.yaml")])
    text = path.read_text()
    try:
        root, loader = _compose(text)
        if duplicates := _duplicates(root):
            raise ParamsError(str(path), duplicates)
        raw = (loader.construct_document(root) if root is not None else None) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(str(path), [("<file>", f"not valid YAML: {exc}")]) from None
    if not isinstance(raw, dict):
        raise ParamsError(str(path), [("<root>", "params.yaml must be a mapping of sections")])
    return raw


def validate(raw: dict[str, Any], source: str) -> PipelineParams:
    try:
        return PipelineParams.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(source, _problems(exc)) from None


def load_params(path: Path, overrides: list[str] | None = None) -> PipelineParams:
    """Read, override and validate params.yaml (contract). Raises ParamsError with every problem."""
    raw = apply_overrides(read_raw(path), overrides or [])
    source = str(path) + (" with -S overrides" if overrides else "")
    # data.source outside the project is checked here, where the project root is known (params.yaml's folder), so
    # that `params check`, `run` and every stage refuse it before anything runs or -S is written.
    data = raw.get("data")
    given = data.get("source") if isinstance(data, dict) else None
    outside = source_outside(given, path.parent.absolute()) if isinstance(given, str) else None
    problems = [("data.source", outside)] if outside else []
    try:
        params = validate(raw, source)
    except ParamsError as exc:
        raise ParamsError(source, exc.problems + problems) from None  # every problem at once
    if problems:
        raise ParamsError(source, problems)
    return params


def write_overrides(path: Path, overrides: list[str]) -> None:
    """Write validated overrides into params.yaml in place, keeping comments, as `dvc exp run -S` does."""
    if not overrides:
        return
    from ruamel.yaml import YAML

    from trainflow.core.io import atomic_path

    load_params(path, overrides)  # validate first: an invalid override never reaches the file
    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 4096  # never wrap a line (a flow-style mapping such as a tune.space dimension stays on its line)
    # ruamel writes None as an empty value; keep the file's `null`s as they are written.
    rt.representer.add_representer(
        type(None), lambda dumper, _: dumper.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    doc = rt.load(path.read_text())
    for text in overrides:
        keys, value = parse_override(text)
        node = doc
        for k in keys[:-1]:
            if k not in node or node[k] is None:
                node[k] = {}
            node = node[k]
        node[keys[-1]] = _flow(value)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        rt.dump(doc, f)


def _flow(value: Any) -> Any:
    """Lists and mappings from -S in flow style (`exclude: [a, b]`), so they stay on the line of their comment."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, list):
        seq = CommentedSeq(_flow(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    if isinstance(value, dict):
        mapping = CommentedMap((k, _flow(v)) for k, v in value.items())
        mapping.fa.set_flow_style()
        return mapping
    return value


def schema() -> dict[str, Any]:
    return PipelineParams.model_json_schema()
