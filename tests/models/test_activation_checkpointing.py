"""train.activation_checkpointing: the same gradients as without (1e-6), with dropout on, for the text transformer and
an hf: model; and it really keeps fewer activations (a no-op would pass the first check)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from support.tiny_models import tiny_bert
from torch import nn

from trainflow.models import hf
from trainflow.models.text import TextTransformer


def text_model() -> nn.Module:
    torch.manual_seed(0)
    return TextTransformer(vocab_size=40, out_features=3, d_model=32, n_heads=4, n_layers=3, dropout=0.2)


def bert_model(directory: Path) -> nn.Module:
    model = hf.HFSequenceModel(3, hf.config(directory, ["a", "b", "c"], 3, 16)["hf_config"], str(directory))
    torch.manual_seed(1)  # the new head
    nn.init.normal_(model.model.classifier.weight)
    return model


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(5, 25, (6, 12), generator=g)
    mask = torch.ones(6, 12, dtype=torch.bool)
    mask[2, 7:] = False
    mask[4, 3:] = False
    tokens[~mask] = 0
    return tokens, mask, torch.randint(0, 3, (6,), generator=g)


def gradients(model: nn.Module, checkpointing: bool, seed: int = 7) -> tuple[dict[str, torch.Tensor], int]:
    """The gradients of one training-mode step (dropout on, the same RNG seed), and how many tensors autograd saved."""
    model.activation_checkpointing(checkpointing)  # type: ignore[operator]
    model.train()
    model.zero_grad(set_to_none=True)
    tokens, mask, y = batch()
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += 1
        return t

    torch.manual_seed(seed)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(tokens, mask), y)
    loss.backward()
    return {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}, saved


@pytest.mark.parametrize("kind", ["text_transformer", "hf"])
def test_checkpointing_gives_the_gradients_of_a_plain_backward(kind: str, tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(30)]
    build: Callable[[], nn.Module] = (
        text_model if kind == "text_transformer" else lambda: bert_model(tiny_bert(tmp_path / "b", words, dropout=0.2))
    )
    model = build()
    plain, saved_plain = gradients(model, False)
    checkpointed, saved_checkpointed = gradients(model, True)
    assert plain.keys() == checkpointed.keys() and len(plain) == len(list(model.parameters()))
    for name, g in plain.items():
        torch.testing.assert_close(checkpointed[name], g, atol=1e-6, rtol=1e-6, msg=name)
    # Dropout was on (another seed, other gradients): the recomputed forward replayed the same masks.
    other, _ = gradients(model, True, seed=8)
    assert any(not torch.allclose(other[n], g) for n, g in plain.items())
    # And the activations were not kept: only each layer's input (and what the head and loss need).
    assert saved_checkpointed < saved_plain / 2, (saved_checkpointed, saved_plain)


def test_a_model_that_cannot_checkpoint_is_a_params_error(iris_project: Path) -> None:
    from trainflow.core.errors import ParamsError
    from trainflow.core.paths import Paths
    from trainflow.params import load_params
    from trainflow.stages import run_stage

    paths = Paths(iris_project)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    params = load_params(paths.params, ["train.activation_checkpointing=true"])
    with pytest.raises(ParamsError, match="train.activation_checkpointing.*MLP cannot recompute"):
        run_stage("train", params, paths)
