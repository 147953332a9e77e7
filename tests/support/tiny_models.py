"""Tiny random Hugging Face models and tokenizers, written as save_pretrained does: a user's local pretrained model,
without a download."""

from __future__ import annotations

from pathlib import Path


def tiny_bert(directory: Path, words: list[str], labels: int = 2, seed: int = 0, dropout: float = 0.1) -> Path:
    """A tiny random BERT (2 layers of width 32) and its WordPiece tokenizer over `words`, written by save_pretrained
    into `directory`: what a user's local pretrained model looks like, without a download."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate([*special, *dict.fromkeys(w.lower() for w in words)])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    ).save_pretrained(directory)  # fmt: skip
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=labels,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)  # fmt: skip
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def tiny_decoder(
    directory: Path, words: list[str], kind: str = "gpt2", labels: int = 2, seed: int = 0, dropout: float = 0.1
) -> Path:
    """A tiny random decoder classifier, `kind` "gpt2" or "llama" (2 layers of width 32; Llama's with grouped-query
    attention), and a word-level tokenizer over `words` with no pad token, as GPT-2's and Llama's have none. Id 0 is
    "!", a real token, as in GPT-2. Written by save_pretrained into `directory`, like `tiny_bert`."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import (
        AutoModelForSequenceClassification,
        GPT2Config,
        LlamaConfig,
        PretrainedConfig,
        PreTrainedTokenizerFast,
    )

    vocab = {w: i for i, w in enumerate(["!", *dict.fromkeys(w.lower() for w in words if w != "!"), "<unk>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(directory)
    end = vocab["<unk>"]  # bos and eos in the vocabulary; no pad id
    config: PretrainedConfig
    if kind == "gpt2":
        config = GPT2Config(vocab_size=len(vocab), n_embd=32, n_layer=2, n_head=2, n_positions=64, num_labels=labels,
                            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=end,
                            eos_token_id=end)  # fmt: skip
    elif kind == "llama":
        config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                             num_labels=labels, attention_dropout=dropout, bos_token_id=end,
                             eos_token_id=end)  # fmt: skip
    else:
        raise ValueError(f"kind {kind!r}: one of 'gpt2', 'llama'")
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    return directory
