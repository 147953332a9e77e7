"""text_bag (issue 29, item 4): the mean of a text's token (and token-pair) embeddings, checked against a hand-written
reference, deaf to padding; model.name auto picks it for text on a CPU and the text_transformer elsewhere."""

from __future__ import annotations

import pytest
import torch

from trainflow.artifacts.export import auto_model, model_config
from trainflow.core.errors import UserError
from trainflow.data.preprocess import Preprocessor
from trainflow.models import build_model
from trainflow.models.text import TextBag
from trainflow.params import PipelineParams, with_values


def reference(model: TextBag, tokens: list[int]) -> torch.Tensor:
    """By hand: the mean of the rows of the tokens and (with buckets) of each neighbouring pair's hashed row."""
    rows = [model.emb.weight[t] for t in tokens]
    if model.buckets:
        rows += [model.emb.weight[model.vocab_size + (a * 1_000_003 + b) % model.buckets]
                 for a, b in zip(tokens, tokens[1:])]  # fmt: skip
    return model.head(torch.stack(rows).mean(dim=0))


@pytest.mark.parametrize("buckets", [0, 7])
def test_the_bag_is_the_mean_of_its_tokens_and_pairs_whatever_the_padding(buckets: int) -> None:
    torch.manual_seed(0)
    model = TextBag(vocab_size=50, out_features=3, d_model=8, buckets=buckets, dropout=0.5).eval()
    with torch.no_grad():
        model.emb.weight.normal_()  # pairs too: they start at zero
    texts = [[2, 17, 5, 5, 40], [2, 9], [2]]
    width = 9
    tokens = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width, dtype=torch.bool)
    for i, t in enumerate(texts):
        tokens[i, : len(t)], mask[i, : len(t)] = torch.tensor(t), True
        tokens[i, len(t) :] = 33  # padding of any id is never counted
    with torch.no_grad():
        out = model(tokens, mask)
        for i, t in enumerate(texts):
            torch.testing.assert_close(out[i], reference(model, t), rtol=1e-6, atol=1e-6)
            alone = model(tokens[i : i + 1, : len(t)], mask[i : i + 1, : len(t)])  # no padding at all
            torch.testing.assert_close(alone[0], out[i], rtol=1e-6, atol=1e-6)


def test_pairs_start_silent_and_the_bag_refuses_bad_sizes() -> None:
    model = TextBag(vocab_size=20, out_features=2, d_model=4, buckets=6)
    assert model.emb.weight.shape == (26, 4) and model.emb.weight[20:].abs().sum() == 0
    assert model.emb.weight[:20].abs().sum() > 0
    with pytest.raises(ValueError, match="buckets at least 0"):
        TextBag(vocab_size=20, out_features=2, buckets=-1)


def text_pre() -> Preprocessor:
    return Preprocessor(target="y", task="classification", classes=["a", "b"], raw_features=[], columns=[],
                        text_column="t", max_length=16)  # fmt: skip


def test_auto_picks_the_bag_for_text_on_a_cpu_and_the_transformer_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    pre = text_pre()
    monkeypatch.setattr(Preprocessor, "vocab_size", property(lambda self: 120))
    params = PipelineParams()
    cpu = model_config(params.model, params.features, pre, device=torch.device("cpu"))
    assert cpu == {"name": "text_bag", "out_features": 2, "vocab_size": 120, "d_model": 128, "dropout": 0.1}
    assert isinstance(build_model(cpu), TextBag)
    assert model_config(params.model, params.features, pre)["name"] == "text_bag"  # no device given: a CPU
    assert model_config(params.model, params.features, pre, device=torch.device("cuda"))["name"] == "text_transformer"
    assert auto_model(pre, torch.device("cpu"))[1].startswith("text on a CPU: a bag of subword")
    named = with_values(params, {"model.name": "text_transformer"}, "test")
    assert (
        model_config(named.model, named.features, pre, device=torch.device("cpu"))["name"] == "text_transformer"
    )  # asked for: kept
    table = Preprocessor(target="y", task="regression", classes=[], raw_features=[], columns=[])
    with pytest.raises(UserError, match="model.name text_bag needs text: set data.text_column"):
        text_bag = with_values(params, {"model.name": "text_bag"}, "test")
        model_config(text_bag.model, text_bag.features, table)
