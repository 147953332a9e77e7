"""Fine-tuning a pretrained Transformers model from a local directory (`model.name: hf:<dir>`): a tiny random BERT
written by save_pretrained learns a generated text task through ingest → split → train → evaluate → register; the
registered model predicts what evaluate scored; layer_decay's per-group rates are logged exactly; a model that is not
there is a clear error saying how to get it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.projects import make_project
from support.reviews import FILLER, NEGATIVE, POSITIVE, reviews
from support.stages import fingerprint_of
from support.tiny_models import tiny_bert

from trainflow import cli
from trainflow.artifacts.predict import ExportedModel
from trainflow.core.errors import UserError
from trainflow.core.io import read_json
from trainflow.core.paths import Paths
from trainflow.models import hf
from trainflow.params import load_params
from trainflow.stages import run_stage

LR, DECAY = 2e-3, 0.8


@pytest.fixture(scope="module")
def hf_pipeline(
    tmp_path_factory: pytest.TempPathFactory, _empty_mlflow_store: Path
) -> tuple[Paths, dict[str, dict], str]:
    """The pipeline run once for the tests below, into an MLflow store of its own (a copy of conftest's migrated empty
    one): its paths, each stage's result and the store's URI, which a test points MLFLOW_TRACKING_URI at. Shared: a
    test may move pretrained/ away (serving must not need it), so none reads it after the pipeline ran."""
    settings = {"data.source": "data/raw/reviews.csv", "data.target": "label", "data.text_column": "text",
                "model.name": "hf:pretrained/tiny-bert", "features.max_length": 24, "train.epochs": 4,
                "train.batch_size": 16, "train.lr": LR, "train.schedule": "constant", "train.warmup_fraction": 0.0,
                "train.layer_decay": DECAY, "train.log_every": 5, "train.progress": "false",
                "register.model_name": "reviews"}  # fmt: skip
    base = tmp_path_factory.mktemp("hf")
    root = make_project(base / "proj", settings)
    tiny_bert(root / "pretrained/tiny-bert", [*POSITIVE, *NEGATIVE, *FILLER, "."])
    reviews(400).to_csv(root / "data/raw/reviews.csv", index=False)
    shutil.copyfile(_empty_mlflow_store, base / "mlflow.db")
    uri = f"sqlite:///{base / 'mlflow.db'}"
    paths = Paths(root)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MLFLOW_TRACKING_URI", uri)
        out = {s: run_stage(s, load_params(paths.params), paths) for s in ("ingest", "split", "train", "evaluate")}
        out["register"] = run_stage("register", load_params(paths.params), paths)
    return paths, out, uri


@pytest.fixture
def hf_run(
    hf_pipeline: tuple[Paths, dict[str, dict], str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Paths, dict[str, dict]]:
    paths, out, uri = hf_pipeline
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return paths, out


def test_a_pretrained_model_fine_tunes_registers_and_predicts_what_evaluate_scored(
    hf_run: tuple[Paths, dict[str, dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, out = hf_run
    root = paths.root
    metrics = read_json(paths.metrics)
    print(f"hf:tiny-bert fine-tuned: test accuracy {metrics['accuracy']:.3f}")
    assert metrics["accuracy"] >= 0.9  # chance is 0.5 (balanced classes)
    # Exported: safetensors + JSON + the model's own tokenizer; no pickle, and no need of the pretrained directory.
    final = paths.final
    assert {p.name for p in final.iterdir()} >= {"model.safetensors", "model.json", "tokenizer.json"}
    assert not [p for p in final.iterdir() if p.suffix in (".pkl", ".pt", ".bin")]
    config = read_json(final / "model.json")
    assert config["name"] == "hf" and "pretrained" not in config
    assert config["hf_config"]["model_type"] == "bert" and config["hf_config"]["id2label"] == {"0": "neg", "1": "pos"}
    training = read_json(final / "training.json")
    assert training["pretrained"]["model"] == "hf:pretrained/tiny-bert"
    assert training["pretrained"]["directory"] == str((root / "pretrained/tiny-bert").resolve())
    # The tokenizer is the pretrained one (WordPiece over its words), not one trained on the texts.
    tokenizer = (final / "tokenizer.json").read_text()
    assert '"WordPiece"' in tokenizer and '"[SEP]"' in tokenizer
    # Registered, and `trainflow predict` by registry URI reproduces evaluate's predictions (the pretrained directory
    # moved away: serving needs only what was registered).
    assert out["register"]["version"] == 1 and out["register"]["champion"]
    (root / "pretrained").rename(root / "elsewhere")
    test = pd.read_parquet(paths.split_file("test"))
    evaluated = pd.read_csv(paths.test_plots / "predictions.csv")
    test[["text"]].to_csv(root / "inputs.csv", index=False)
    monkeypatch.chdir(root)
    args = ["predict", "--model", "models:/reviews@champion", "--input", "inputs.csv", "--output", "out.parquet"]
    assert cli.main(args) == 0
    predicted = pd.read_parquet(root / "out.parquet")
    assert predicted["prediction"].tolist() == evaluated["predicted"].astype(str).tolist()
    exported = ExportedModel.load(final)
    proba = exported.outputs(test)
    assert np.array_equal(predicted[[f"proba_{c}" for c in exported.pre.classes]].to_numpy(), proba)
    accuracy = float((predicted["prediction"].to_numpy() == test["label"].to_numpy()).mean())
    assert accuracy == metrics["accuracy"]


def test_layer_decay_rates_logged_at_an_update_are_exact(hf_run: tuple[Paths, dict[str, dict]]) -> None:
    """BERT's layers: the embeddings are layer 0, encoder.layer.i is i + 1, the pooler and head L + 1 = 3."""
    from mlflow.tracking import MlflowClient

    _, out = hf_run
    run = MlflowClient().get_run(out["train"]["mlflow_run_id"])
    rates = {k.removeprefix("lr/"): v for k, v in run.data.metrics.items() if k.startswith("lr/")}
    assert sorted(rates) == sorted(f"layer{i}.{kind}" for i in range(4) for kind in ("decay", "no_decay"))
    for name, rate in rates.items():
        layer = int(name.split(".")[0].removeprefix("layer"))
        expected = torch.tensor(LR, dtype=torch.float32) * torch.tensor(DECAY ** (3 - layer))  # float32, as used
        assert rate == expected.item(), name
    assert run.data.metrics["lr"] == torch.tensor(LR, dtype=torch.float32).item()


def test_layer_of_numbers_bert_parameters_from_the_embeddings_up(tmp_path: Path) -> None:
    directory = tiny_bert(tmp_path / "bert", ["good", "bad"])
    model = hf.HFSequenceModel(2, hf.config(directory, ["a", "b"], 2, 16)["hf_config"], str(directory))
    layers = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert layers["model.bert.embeddings.word_embeddings.weight"] == 0
    assert layers["model.bert.embeddings.LayerNorm.bias"] == 0
    assert layers["model.bert.encoder.layer.0.attention.self.query.weight"] == 1
    assert layers["model.bert.encoder.layer.1.output.dense.bias"] == 2
    assert layers["model.bert.pooler.dense.weight"] == 3 and layers["model.classifier.weight"] == 3
    assert model.num_layers == 2


def test_the_pretrained_weights_are_loaded_and_only_a_resized_head_is_new(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    directory = tiny_bert(tmp_path / "bert", ["good", "bad"], labels=2)
    saved = load_file(str(directory / "model.safetensors"))
    config = hf.config(directory, ["a", "b", "c"], 3, 16)["hf_config"]
    model = hf.HFSequenceModel(3, config, str(directory))
    mine = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    same = [k for k in saved if not k.startswith("classifier.")]
    assert same and all(torch.equal(mine[k], saved[k]) for k in same)
    assert mine["classifier.weight"].shape == (3, 32)  # three classes: a new head
    # Without `pretrained` (the exported model), the same architecture from the config alone.
    bare = hf.HFSequenceModel(3, config)
    assert bare.state_dict().keys() == model.state_dict().keys()


def test_a_missing_model_names_the_directory_the_cache_and_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        hf.resolve("hf:models/nowhere", tmp_path)
    message = str(err.value)
    assert str(tmp_path / "models/nowhere") in message and "hf download models/nowhere" in message
    assert "save_pretrained(dir)" in message
    (tmp_path / "half").mkdir()
    with pytest.raises(UserError, match="has no config.json"):
        hf.resolve("hf:half", tmp_path)


def test_a_hub_id_resolves_to_its_snapshot_in_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout huggingface_hub writes (models--org--name/refs/main + snapshots/<commit>/): found offline."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--someorg--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs/main").write_text("0" * 40)
    tiny_bert(repo / "snapshots" / ("0" * 40), ["good", "bad"])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    assert hf.resolve("hf:someorg/tiny", tmp_path) == repo / "snapshots" / ("0" * 40)


def test_other_pretrained_files_are_another_fingerprint_so_a_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    root = make_project(tmp_path / "proj", {"model.name": "hf:pretrained/bert"})
    directory = tiny_bert(root / "pretrained/bert", ["good", "bad"])
    params = load_params(root / "params.yaml")
    before = fingerprint_of(params, "data", root)
    assert fingerprint_of(params, "data", root) == before
    tokenizer = directory / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace('"good"', '"fine"'))  # another tokenizer, same size
    assert fingerprint_of(params, "data", root) != before


def test_a_logged_pretrained_model_lists_transformers_among_its_requirements(
    hf_run: tuple[Paths, dict[str, dict]],
) -> None:
    """What `mlflow models serve` (or a pip install of the model's requirements) installs: serving an hf: model
    imports transformers."""
    import mlflow

    paths, _ = hf_run
    model_uri = read_json(paths.train_run)["model_uri"]
    requirements = Path(mlflow.pyfunc.get_model_dependencies(model_uri)).read_text().split()
    assert "transformers" in requirements and "tokenizers" in requirements


def test_a_pretrained_encoder_fine_tunes_on_packed_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """train.packing with an hf: encoder: the train stage packs its batches (its first tokens through the model's own
    pooler and head: tests/models/test_hf_forward.py) and the model learns the task as padded batches do."""
    settings = {"data.source": "data/raw/reviews.csv", "data.target": "label", "data.text_column": "text",
                "model.name": "hf:pretrained/tiny-bert", "features.max_length": 24, "train.epochs": 4,
                "train.batch_size": 16, "train.lr": LR, "train.packing": "true", "train.progress": "false",
                "register.model_name": "reviews"}  # fmt: skip
    root = make_project(tmp_path / "proj", settings)
    tiny_bert(root / "pretrained/tiny-bert", [*POSITIVE, *NEGATIVE, *FILLER, "."])
    reviews(400).to_csv(root / "data/raw/reviews.csv", index=False)
    paths = Paths(root)
    for stage in ("ingest", "split", "train", "evaluate"):
        run_stage(stage, load_params(paths.params), paths)
    assert "train: batches packed (rows as wide as each batch's longest sequence)" in capsys.readouterr().err
    assert read_json(paths.metrics)["accuracy"] >= 0.9  # chance is 0.5, as in the padded pipeline above
