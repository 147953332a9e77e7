"""Hugging Face models (trainflow.models.hf), on tiny random configs built here (nothing downloaded): names and
local directories (and their hash), the config and tokenizer a task gets, a model built from its config alone, the
score a decoder reads, the layers of each family, the FLOPs counted and activation checkpointing."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from trainflow.core.errors import UserError


def bert_config(**kwargs: Any) -> Any:
    from transformers import BertConfig

    settings = dict(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                    max_position_embeddings=16)  # fmt: skip
    return BertConfig(**{**settings, **kwargs})


def test_hf_names_and_local_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from trainflow.models import hf

    assert hf.is_hf("hf:x") and not hf.is_hf("mlp") and not hf.is_hf("xhf:y") and not hf.is_hf("HF:x")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert hf.resolve("hf: m ", tmp_path) == (tmp_path / "m").resolve()
    assert hf.resolve(f"hf:{tmp_path / 'm'}", Path("/nonexistent")) == (tmp_path / "m").resolve()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf.resolve("hf:~/m", Path("/nonexistent")) == (tmp_path / "m").resolve()
    (tmp_path / "half").mkdir()
    with pytest.raises(UserError) as half:
        hf.resolve("hf:half", tmp_path)
    assert str(half.value) == (
        f"model.name hf:half: {(tmp_path / 'half').resolve()} has no config.json; give the directory that "
        "save_pretrained(...) wrote (the model and its tokenizer), e.g. model.save_pretrained(dir) and "
        "tokenizer.save_pretrained(dir)"
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(UserError) as missing:
        hf.resolve("hf:org/none", tmp_path)
    assert str(missing.value) == (
        f"model.name hf:org/none: no directory {(tmp_path / 'org/none').resolve()}, and no model 'org/none' in the "
        f"local Hugging Face cache ({tmp_path / 'hub'}); trainflow downloads nothing. On a machine with internet, "
        "save it with `hf download org/none` (into the cache; copy the cache here) or with "
        "AutoModelForSequenceClassification.from_pretrained('org/none').save_pretrained(dir) and "
        "AutoTokenizer.from_pretrained('org/none').save_pretrained(dir), then set model.name: hf:dir"
    )
    assert missing.value.__suppress_context__


def test_the_directory_hash_covers_visible_files_names_and_bytes(tmp_path: Path) -> None:
    from trainflow.models import hf

    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / ".cache").mkdir()
    (d / "b.json").write_bytes(b"{}")
    (d / "a.bin").write_bytes(bytes(range(256)) * 5000)  # over 1 MiB: read in chunks
    (d / "sub" / "c.txt").write_text("c")
    (d / ".hidden").write_text("h")
    (d / ".cache" / "x").write_text("x")
    expected = hashlib.sha256(b"a.bin\0" + bytes(range(256)) * 5000 + b"b.json\0{}" + b"sub/c.txt\0c").hexdigest()
    assert hf.directory_hash(d) == expected
    (d / ".hidden").write_text("changed")
    assert hf.directory_hash(d) == expected
    (d / "sub" / "c.txt").write_text("d")
    assert (
        hf.directory_hash(d)
        == hashlib.sha256(b"a.bin\0" + bytes(range(256)) * 5000 + b"b.json\0{}" + b"sub/c.txt\0d").hexdigest()
    )


def test_quiet_silences_transformers_and_restores_its_level() -> None:
    from transformers.utils import logging

    from trainflow.models import hf

    before = logging.get_verbosity()
    logging.set_verbosity_info()
    try:
        with hf._quiet():
            assert logging.get_verbosity() == logging.ERROR
        assert logging.get_verbosity() == logging.INFO
        with pytest.raises(KeyError), hf._quiet():
            raise KeyError("x")
        assert logging.get_verbosity() == logging.INFO
    finally:
        logging.set_verbosity(before)


def test_the_config_takes_the_task_s_outputs_and_labels(tmp_path: Path) -> None:
    from trainflow.models import hf

    bert_config().save_pretrained(tmp_path)
    got = hf.config(tmp_path, ["neg", "pos", "mixed"], 3, 16)["hf_config"]
    assert got["id2label"] == {"0": "neg", "1": "pos", "2": "mixed"}
    assert got["label2id"] == {"neg": 0, "pos": 1, "mixed": 2}
    assert got["hidden_size"] == 8 and got["num_hidden_layers"] == 2 and got["model_type"] == "bert"
    regression = hf.config(tmp_path, [], 1, 5)["hf_config"]
    assert regression["id2label"] == {"0": "value"} and regression["label2id"] == {"value": 0}
    with pytest.raises(UserError) as long:
        hf.config(tmp_path, ["a", "b"], 2, 17)
    assert str(long.value) == (
        f"features.max_length is 17 but {tmp_path} takes at most 16 tokens per sequence (max_position_embeddings); "
        "set features.max_length <= 16"
    )


def test_the_tokenizer_truncates_pads_nothing_and_names_its_pad_id(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trainflow.models import hf

    vocab = {w: i for i, w in enumerate(["a", "b", "c", "<unk>", "<pad>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>").save_pretrained(tmp_path / "p")
    bert_config().save_pretrained(tmp_path / "p")
    encoder, pad = hf.tokenizer(tmp_path / "p", 3)
    assert pad == 4
    assert encoder.encode("a b c a b").ids == [0, 1, 2]
    assert encoder.encode("b").ids == [1] and encoder.padding is None
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(tmp_path / "n")
    bert_config().save_pretrained(tmp_path / "n")
    assert hf.tokenizer(tmp_path / "n", 8)[1] == 0  # no pad token: 0


def test_a_model_from_its_config_alone_knows_its_kind() -> None:
    from transformers import GPT2Config, masking_utils

    from trainflow.models import hf

    bert = hf.HFSequenceModel(3, bert_config().to_dict())
    assert (bert.out_features, bert.num_layers, bert.hidden_size, bert.decoder, bert.sliding_window) == (
        3, 2, 8, False, None
    )  # fmt: skip
    assert bert.mask_function is masking_utils.bidirectional_mask_function
    assert bert.model.config.num_labels == 3
    assert all(q.dtype == torch.float32 for q in bert.parameters())
    gpt = hf.HFSequenceModel(2, GPT2Config(vocab_size=20, n_embd=8, n_layer=3, n_head=2, n_positions=16).to_dict())
    assert (gpt.num_layers, gpt.hidden_size, gpt.decoder) == (3, 8, True)
    assert gpt.mask_function is masking_utils.causal_mask_function
    mask = torch.tensor([[True, True, False]])
    assert gpt._attention_mask(mask).tolist() == [[[[True, False, False], [True, True, False], [True, True, False]]]]
    assert bert._attention_mask(mask).tolist() == [[[[True, True, False]] * 3]]
    bert.model.config._attn_implementation = "flash_attention_2"  # another mask kind: the 2-D mask as it is
    assert bert._attention_mask(mask) is mask


def test_a_decoder_reads_the_score_at_its_last_real_token() -> None:
    from transformers import GPT2Config

    from trainflow.models import hf

    torch.manual_seed(0)
    gpt = hf.HFSequenceModel(2, GPT2Config(vocab_size=20, n_embd=8, n_layer=1, n_head=2, n_positions=16).to_dict())
    gpt.eval()
    tokens = torch.tensor([[3, 4, 5, 0], [6, 7, 0, 0]])
    mask = tokens > 0
    with torch.no_grad():
        got = gpt(tokens, mask)
        expected = [gpt.model.score(gpt.model.transformer(input_ids=tokens[i : i + 1, :n]).last_hidden_state[0, -1])
                    for i, n in enumerate((3, 2))]  # fmt: skip
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_layer_of_reads_the_numbered_layers_of_each_family() -> None:
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    cases = {
        "model.bert.embeddings.word_embeddings.weight": 0,
        "model.model.embed_tokens.weight": 0,
        "model.transformer.wte.weight": 0,
        "model.transformer.wpe.weight": 0,
        "model.bert.encoder.layer.0.output.dense.bias": 1,
        "model.model.layers.4.mlp.up_proj.weight": 5,
        "model.transformer.h.12.attn.c_attn.weight": 13,
        "model.encoder.block.1.layer.0.SelfAttention.q.weight": 2,
        "model.x.blocks.7.y": 8,
        "model.transformer.ln_f.weight": 3,
        "model.classifier.weight": 3,
        "model.x.layer.3": 3,  # no dot after the number: not a layer
        "layer.3.x": 3,  # no dot before "layer"
    }
    assert {name: model.layer_of(name) for name in cases} == cases


def test_hf_flops_count_what_is_outside_the_embeddings() -> None:
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    # BERT, hidden 8, intermediate 16, 2 layers: per layer q, k, v, out 4 x (64 + 8), norms 2 x 16, intermediate
    # 8 x 16 + 16, output 16 x 8 + 8: 288 + 32 + 144 + 136 = 600; pooler 72, classifier 8 x 2 + 2 = 18.
    assert model.flops_per_token(5) == 6.0 * (2 * 600 + 72 + 18) + 12 * 2 * 8 * 5
    assert type(model.flops_per_token(5)) is float


def test_activation_checkpointing_on_off_and_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    newer = hasattr(type(model.model), "is_activation_checkpointing")  # Transformers 5's name

    def checkpointing() -> bool:
        return bool(model.model.is_activation_checkpointing if newer else model.model.is_gradient_checkpointing)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Transformers 5's own names: the old gradient_checkpointing_* ones warn
        model.activation_checkpointing(True)
        assert checkpointing()
        assert model.model.bert._gradient_checkpointing_func.keywords == {"use_reentrant": False}  # keeps RNG state
        model.activation_checkpointing(False)
        assert not checkpointing()
    monkeypatch.setattr(type(model.model), "supports_gradient_checkpointing", False)
    with pytest.raises(UserError) as exc:
        model.activation_checkpointing(True)
    assert str(exc.value) == "BertForSequenceClassification does not support activation checkpointing"
    model.activation_checkpointing(False)


def test_activation_checkpointing_calls_transformers_4_names_where_the_new_ones_are_missing() -> None:
    """Transformers 4 has gradient_checkpointing_* only: both directions call those (the 5 names would fail)."""
    from trainflow.models import hf

    model = hf.HFSequenceModel(2, bert_config().to_dict())
    calls: list[tuple[Any, ...]] = []

    class Older:  # Transformers 4's API, recording what it is asked
        supports_gradient_checkpointing = True

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any]) -> None:
            calls.append(("enable", gradient_checkpointing_kwargs))

        def gradient_checkpointing_disable(self) -> None:
            calls.append(("disable",))

    del model.model  # a registered submodule: replaced by a plain attribute
    model.model = Older()
    model.activation_checkpointing(True)
    model.activation_checkpointing(False)
    assert calls == [("enable", {"use_reentrant": False}), ("disable",)]
