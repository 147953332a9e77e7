"""Every parameter of the pipeline, validated. params.yaml holds one top-level key per stage (contract): a module
here per section (`data`, `split`, `features`, `model`, `train`, `evaluate`, `register`, `tracking`, `deploy`, `tune`)
and `pipeline` for the whole file. Import from here: `from trainflow.params import TrainParams, load_params`.

`load_params(path, overrides)` merges dotted `key=value` overrides (YAML values, as `dvc exp run -S`) into the file's
contents, validates the result and raises ParamsError listing every problem with its dotted path.
"""

from trainflow.params.base import Section
from trainflow.params.data import BUILTIN_DATASETS, GLOB_CHARS, RAW, DataParams, default_model_name, source_outside
from trainflow.params.deploy import DEFAULT_CRON, DEPLOYMENT_NAME, DeployParams, check_cron
from trainflow.params.evaluate import EvaluateParams
from trainflow.params.features import AugmentParams, FeatureParams
from trainflow.params.model import BUILTIN_MODEL_CODE, MODEL_PATH, ModelParams
from trainflow.params.pipeline import (
    LOCATED,
    PipelineParams,
    _problems,
    apply_overrides,
    duplicate_keys,
    load_params,
    parse_override,
    read_raw,
    schema,
    validate,
    with_values,
    write_overrides,
)
from trainflow.params.register import GateMetric, RegisterParams
from trainflow.params.split import SplitParams
from trainflow.params.tracking import TrackingParams
from trainflow.params.train import (
    MINIMIZED,
    RANKED,
    Monitor,
    ParamGroupRule,
    ProfileParams,
    TrainParams,
    duration_seconds,
    global_batch_problem,
)
from trainflow.params.tune import TUNABLE_SECTIONS, UNTUNABLE, Dimension, TuneParams, default_space

__all__ = [
    "AugmentParams",
    "BUILTIN_DATASETS",
    "BUILTIN_MODEL_CODE",
    "DEFAULT_CRON",
    "DEPLOYMENT_NAME",
    "DataParams",
    "DeployParams",
    "Dimension",
    "EvaluateParams",
    "FeatureParams",
    "GLOB_CHARS",
    "GateMetric",
    "LOCATED",
    "MINIMIZED",
    "MODEL_PATH",
    "ModelParams",
    "Monitor",
    "ParamGroupRule",
    "PipelineParams",
    "ProfileParams",
    "RANKED",
    "RAW",
    "RegisterParams",
    "Section",
    "SplitParams",
    "TUNABLE_SECTIONS",
    "TrackingParams",
    "TrainParams",
    "TuneParams",
    "UNTUNABLE",
    "_problems",
    "apply_overrides",
    "check_cron",
    "default_model_name",
    "default_space",
    "duplicate_keys",
    "duration_seconds",
    "global_batch_problem",
    "load_params",
    "parse_override",
    "read_raw",
    "schema",
    "source_outside",
    "validate",
    "with_values",
    "write_overrides",
]
