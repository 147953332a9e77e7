"""hf: models compute what Transformers computes. `HFSequenceModel.forward` (tokens, mask) against Transformers' own
forward with the 2-D mask, for an encoder (BERT) and two decoders (GPT-2, Llama with grouped-query attention), under
SDPA and eager attention, padded and unpadded: a decoder is causal, padded positions carry no weight, and a decoder
reads its last real token even when that token's id is the pad id; a model that does not declare Transformers'
attention backends builds its own 2-D mask. Tiny random models built in tmp_path."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from support.tiny_models import tiny_bert, tiny_decoder

from trainflow.models import hf

WORDS = [f"w{i}" for i in range(30)]
KINDS = ["bert", "gpt2", "llama"]
DECODERS = ["gpt2", "llama"]
ATTENTION = ["sdpa", "eager"]
PAD = 0  # the pad id hf.tokenizer gives all three: BERT's [PAD]; GPT-2's and Llama's none, so 0 (here "!")
LENGTHS = [9, 6, 2, 8]  # right-padded to 9, as the engine pads (TextData)


def pretrained(kind: str, tmp_path: Path) -> Path:
    """A tiny model of `kind` with larger random weights than an initialisation's (std 0.3, not 0.02): its outputs
    then vary with what each token attends to by far more than the 1e-5 the comparisons allow."""
    from transformers import AutoModelForSequenceClassification

    directory = tmp_path / kind
    if kind == "bert":
        tiny_bert(directory, WORDS)
    else:
        tiny_decoder(directory, WORDS, kind=kind)
    model = AutoModelForSequenceClassification.from_pretrained(directory)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
    model.save_pretrained(directory)
    return directory


def ours(directory: Path, attention: str) -> hf.HFSequenceModel:
    model = hf.HFSequenceModel(2, hf.config(directory, ["neg", "pos"], 2, 16)["hf_config"], str(directory))
    model.model.set_attn_implementation(attention)
    return model.eval()


def theirs(directory: Path, attention: str, pad_token_id: int | None = PAD) -> Any:
    """Transformers' own classifier from the same directory. A decoder's config gets a pad id (GPT-2's and Llama's have
    none, and Transformers then refuses a batch > 1) that no real token of `batch` uses, so it finds the last real
    token where the mask says; `pad_token_id=None` for one unpadded row at a time."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation=attention)
    if model.config.model_type != "bert":
        model.config.pad_token_id = pad_token_id
    return model.eval()


def batch(padded: bool, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [4, 9] (real ones never the pad id) and the mask, right-padded with the pad id when `padded`."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(LENGTHS if padded else [max(LENGTHS)] * len(LENGTHS))
    mask = torch.arange(max(LENGTHS))[None, :] < lengths[:, None]
    tokens = torch.randint(PAD + 1, len(WORDS) + 1, mask.shape, generator=g)
    return tokens.masked_fill(~mask, PAD), mask


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", KINDS)
def test_the_forward_is_transformers_own_forward_with_the_2d_mask(
    tmp_path: Path, kind: str, attention: str, padded: bool
) -> None:
    directory = pretrained(kind, tmp_path)
    tokens, mask = batch(padded)
    with torch.no_grad():
        expected = theirs(directory, attention)(input_ids=tokens, attention_mask=mask.long()).logits
        got = ours(directory, attention)(tokens, mask)
    assert expected.abs().max() > 0.1  # logits of some size: 1e-5 is a real tolerance
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", DECODERS)
def test_a_decoder_output_at_a_position_never_depends_on_a_later_token(
    tmp_path: Path, kind: str, attention: str
) -> None:
    model = ours(pretrained(kind, tmp_path), attention)
    hidden: list[torch.Tensor] = []
    model.model.base_model.register_forward_hook(lambda _m, _a, out: hidden.append(out.last_hidden_state))
    tokens, mask = batch(padded=False)
    tokens, mask = tokens[:1], mask[:1]  # one row: what Transformers' own GPT-2 head takes without a pad id
    later = tokens.clone()
    later[0, 5] = tokens[0, 5] % len(WORDS) + 1  # another real token at position 5
    with torch.no_grad():
        logits = [model(tokens, mask), model(later, mask)]
    before, after = hidden
    torch.testing.assert_close(after[:, :5], before[:, :5], rtol=0, atol=1e-6)
    assert (after[:, 5:] - before[:, 5:]).abs().amax(dim=-1).min() > 1e-3  # seen from position 5 on
    assert not torch.allclose(logits[0], logits[1])


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", KINDS)
def test_padded_positions_carry_no_weight_whatever_their_ids(tmp_path: Path, kind: str, attention: str) -> None:
    """Each padded row computes what Transformers computes for that row alone, unpadded (no mask at all), whatever
    the padded positions hold: the pad id, other real tokens, the row's own tokens again."""
    directory = pretrained(kind, tmp_path)
    model = ours(directory, attention)
    reference = theirs(directory, attention, pad_token_id=None)
    tokens, mask = batch(padded=True)
    g = torch.Generator().manual_seed(7)
    fills = [torch.randint(PAD + 1, len(WORDS) + 1, tokens.shape, generator=g), tokens.flip(1)]
    with torch.no_grad():
        alone = torch.cat([reference(input_ids=t[:n][None]).logits for t, n in zip(tokens, LENGTHS, strict=True)])
        for fill in [torch.full_like(tokens, PAD), *fills]:
            got = model(torch.where(mask, tokens, fill), mask)
            torch.testing.assert_close(got, alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", DECODERS)
def test_a_decoder_reads_its_last_real_token_even_when_its_id_is_the_pad_id(
    tmp_path: Path, kind: str, attention: str
) -> None:
    """Rows ending in "!" (id 0, the pad id: no pad token), padded with 0: each row's logits are those of Transformers'
    own classifier on that row alone, which reads the last token."""
    directory = pretrained(kind, tmp_path)
    tokenizer, pad = hf.tokenizer(directory, 16)
    assert pad == PAD and tokenizer.encode("w1 w2!").ids[-1] == PAD  # no pad token: 0, the id of "!", a real token
    tokens, mask = batch(padded=True)
    last = torch.tensor(LENGTHS) - 1
    tokens[torch.arange(len(LENGTHS)), last] = PAD
    reference = theirs(directory, attention, pad_token_id=None)
    with torch.no_grad():
        got = ours(directory, attention)(tokens, mask)
        alone = torch.cat([reference(input_ids=t[:n][None]).logits for t, n in zip(tokens, LENGTHS, strict=True)])
    torch.testing.assert_close(got, alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_the_exported_model_built_from_its_config_computes_the_same(tmp_path: Path, kind: str) -> None:
    """What predict and serve load: the architecture from model.json's hf_config (JSON), no pretrained directory, then
    the weights. A padded batch of 4, pad ids at the end of real rows included."""
    directory = pretrained(kind, tmp_path)
    trained = ours(directory, "sdpa")
    saved = json.loads(json.dumps(hf.config(directory, ["neg", "pos"], 2, 16)["hf_config"]))
    exported = hf.HFSequenceModel(2, saved)
    exported.load_state_dict(trained.state_dict())
    exported.eval()
    assert exported.model.config._attn_implementation == trained.model.config._attn_implementation == "sdpa"
    tokens, mask = batch(padded=True)
    tokens[0, -1] = PAD
    with torch.no_grad():
        assert torch.equal(exported(tokens, mask), trained(tokens, mask))


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", KINDS)
def test_under_bf16_autocast_it_runs_and_stays_close(tmp_path: Path, kind: str, attention: str) -> None:
    """On CPU, bf16 autocast as training runs it: close to Transformers' own forward under the same autocast (the
    same ops, so far closer than to fp32), and to fp32 within bf16's precision."""
    directory = pretrained(kind, tmp_path)
    model, reference = ours(directory, attention), theirs(directory, attention)
    tokens, mask = batch(padded=True)
    with torch.no_grad():
        fp32 = model(tokens, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(tokens, mask)
            expected = reference(input_ids=tokens, attention_mask=mask.long()).logits
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected)  # bf16's default tolerance: rtol 1.6e-2 (a few units in the last place)
    torch.testing.assert_close(got.float(), fp32, rtol=0, atol=0.05 * fp32.abs().max().item())


@pytest.mark.parametrize("attention", ATTENTION)
def test_a_batch_longer_than_the_sliding_window_gets_the_windowed_masks(tmp_path: Path, attention: str) -> None:
    """Mistral attends to the last `sliding_window` tokens only: a batch that fits in the window has the full causal
    mask trainflow builds; a longer one gets the 2-D mask, and Transformers builds the windowed masks."""
    from transformers import MistralConfig, MistralForSequenceClassification

    config = MistralConfig(vocab_size=len(WORDS) + 1, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, sliding_window=5,
                           num_labels=2, initializer_range=0.3, bos_token_id=1, eos_token_id=1)  # fmt: skip
    torch.manual_seed(0)
    MistralForSequenceClassification(config).save_pretrained(tmp_path / "mistral")
    model, reference = ours(tmp_path / "mistral", attention), theirs(tmp_path / "mistral", attention)
    for length in (5, 9):
        tokens, mask = batch(padded=True)
        tokens, mask = tokens[:, :length], mask[:, :length]
        with torch.no_grad():
            expected = reference(input_ids=tokens, attention_mask=mask.long()).logits
            torch.testing.assert_close(model(tokens, mask), expected, rtol=0, atol=1e-5)
        assert (model._attention_mask(mask).dim() == 4) == (length <= 5)


@pytest.mark.parametrize("kind", DECODERS)
def test_layer_of_numbers_decoder_parameters_from_the_embeddings_up(tmp_path: Path, kind: str) -> None:
    """Against the model's own structure: 0 the token (and GPT-2's position) embeddings, i + 1 the parameters of block
    i, num_layers + 1 the rest (the final norm, the score head)."""
    model = ours(tiny_decoder(tmp_path / kind, WORDS, kind), "sdpa")
    base = model.model.base_model
    embeddings, blocks = ([base.wte, base.wpe], base.h) if kind == "gpt2" else ([base.embed_tokens], base.layers)
    expected = {id(p): i + 1 for i, block in enumerate(blocks) for p in block.parameters()}
    expected |= {id(p): 0 for module in embeddings for p in module.parameters()}
    layers = {name: model.layer_of(name) for name, _ in model.named_parameters()}
    assert layers == {name: expected.get(id(p), len(blocks) + 1) for name, p in model.named_parameters()}
    assert model.num_layers == len(blocks) == 2 and sorted(set(layers.values())) == [0, 1, 2, 3]


@pytest.mark.parametrize("outputs", [3, 5])
def test_the_classifier_has_out_features_outputs_whatever_the_config_says(tmp_path: Path, outputs: int) -> None:
    """A pretrained directory's config of 2 labels (saved without its labels): the model built for `outputs` classes,
    from the config alone or from the pretrained weights (its head then new), gives `outputs` logits per row."""
    directory = tiny_bert(tmp_path / "bert", WORDS, labels=2)
    saved = json.loads((directory / "config.json").read_text())
    tokens, mask = batch(padded=True)
    for model in (hf.HFSequenceModel(outputs, saved), hf.HFSequenceModel(outputs, saved, str(directory))):
        assert model.out_features == model.model.config.num_labels == outputs
        with torch.no_grad():
            assert model.eval()(tokens, mask).shape == (len(tokens), outputs)


def test_a_model_that_does_not_declare_attention_backend_support_builds_its_own_masks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model whose modeling module uses only the plain mask builders, but which does not declare
    `_supports_attention_backend` at all, gets the 2-D mask (None); declaring it True gets the causal mask function."""
    import torch
    from transformers import PretrainedConfig, masking_utils

    from trainflow.models.hf import _self_attention_mask

    modeling = types.ModuleType("survivors_fake_modeling")
    modeling.create_causal_mask = masking_utils.create_causal_mask  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, modeling.__name__, modeling)

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = PretrainedConfig()

        @property
        def base_model(self) -> torch.nn.Module:  # as PreTrainedModel's: the module whose code builds the masks
            return self

    class Declaring(Decoder):
        _supports_attention_backend = True

    Decoder.__module__ = Declaring.__module__ = modeling.__name__
    assert not hasattr(Decoder(), "_supports_attention_backend")
    assert _self_attention_mask(Decoder()) is None
    assert _self_attention_mask(Declaring()) is masking_utils.causal_mask_function


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kind", KINDS)
def test_packed_sequences_are_transformers_own_forward_on_each_sequence_alone(
    tmp_path: Path, kind: str, attention: str
) -> None:
    """train.packing for hf: models: sequences packed into shared rows (TextData.pack) give each sequence the logits
    Transformers' own classifier gives it alone, unpadded, one row at a time."""
    from trainflow.engine.loaders import LONGEST, TextData

    directory = pretrained(kind, tmp_path)
    g = torch.Generator().manual_seed(3)
    sequences = [torch.randint(PAD + 1, len(WORDS) + 1, (k,), generator=g) for k in [5, 2, 9, 3, 4, 1, 7, 6]]
    model = ours(directory, attention)
    assert model.packing == "rows"
    for width in (LONGEST, 12):
        packed = TextData(sequences, torch.zeros(len(sequences)), pad_id=PAD).pack(torch.arange(8), width)
        assert packed.inputs["tokens"].shape[0] < len(sequences)  # rows shared by several sequences
        with torch.no_grad():
            got = model(**packed.inputs)
            expected = torch.cat([theirs(directory, attention, None)(input_ids=s[None]).logits for s in sequences])
        assert expected.abs().max() > 0.1
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
