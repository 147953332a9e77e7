"""`train.batch_size: auto` on the GPU, where "fits" is probed (a forward+backward under the memory limit) rather
than estimated: the train stage picks a micro-batch that fits and reports training's peak memory, and a memory budget
between two probes' peaks picks the larger micro-batch under it. tests/engine/test_batch_size.py runs the same search
on the CPU's estimate."""

from __future__ import annotations

from pathlib import Path

import torch
from engine_kit import BASE
from support.projects import make_project

from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.engine.batch_size import CudaProbe, resolve, state_bytes, untouched
from trainflow.engine.distributed import Group
from trainflow.engine.loaders import TextData
from trainflow.engine.objective import Objective
from trainflow.engine.precision import Precision
from trainflow.models.text import TextTransformer
from trainflow.params import TrainParams, load_params
from trainflow.stages import run_stage

from .gpu_kit import CUDA


def test_the_train_stage_picks_a_batch_that_fits_and_reports_its_peak_memory(tmp_path: Path) -> None:
    overrides = {"train.device": "cuda", "train.batch_size": "auto", "train.global_batch": 64, "train.epochs": 3,
                 "train.progress": "false"}  # fmt: skip
    paths = Paths(make_project(tmp_path / "proj", overrides))
    for stage in ("ingest", "split", "train"):
        run_stage(stage, load_params(paths.params), paths)
    summary = read_json(paths.final / "training.json")
    chosen = summary["batch_size_auto"]
    gpu_mb = torch.cuda.get_device_properties(CUDA).total_memory / 2**20
    # The digits mlp fits whole: one micro-batch of 64, probed on this GPU.
    assert (chosen["batch_size"], chosen["accumulate"], chosen["global_batch"]) == (64, 1, 64)
    assert chosen["limit"].startswith("GPU memory") and 0 < chosen["probe_peak_mb"] < gpu_mb
    # Training's own peak (the probes' is reset before it), in the run's record: models/final holds what the model is.
    assert 0 < read_json(paths.train_run)["peak_memory_mb"] < gpu_mb


def test_a_memory_budget_between_two_probes_picks_the_larger_batch_under_it() -> None:
    torch.manual_seed(0)
    model = TextTransformer(1000, 4, d_model=128, n_heads=4, n_layers=2, max_len=256, dropout=0.0).to(CUDA)
    g = torch.Generator().manual_seed(0)
    data = TextData([torch.randint(1, 1000, (256,), generator=g) for _ in range(64)], torch.arange(64) % 4)
    data.to(CUDA)
    objective, precision = Objective("classification"), Precision("fp32", "cuda")
    p = TrainParams.model_validate({**BASE, "batch_size": "auto", "global_batch": 64})
    # The peaks of the probe resolve() runs, at micro-batches 16 and 32 (activations grow with the batch).
    probe = CudaProbe(model, data, objective, precision, CUDA, state_bytes(model, p, Group()), budget=None)
    with untouched(model, CUDA):
        assert probe.fits(16) and probe.fits(32)
    assert probe.peaks[32] > probe.peaks[16] * 1.2, probe.peaks
    budget = (probe.peaks[16] + probe.peaks[32]) / 2
    params, choice = resolve(p.model_copy(update={"memory_budget_mb": budget}), model, data, objective, precision,
                             CUDA, Group())  # fmt: skip
    assert choice is not None
    assert (params.batch_size, params.accumulate, choice.batch_size) == (16, 4, 16)
    assert choice.peak_mb is not None and choice.peak_mb <= budget
    assert choice.limit.endswith("(memory budget)"), choice.limit
