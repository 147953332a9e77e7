"""Pretrained Hugging Face Transformers, fine-tuned as sequence classifiers or regressors: `model.name: hf:<where>`.

<where> is a directory written by `save_pretrained` (the model and its tokenizer), relative to the project root or
absolute, or a hub id already in the local Hugging Face cache. Nothing is downloaded: trainflow runs offline. The
model is `AutoModelForSequenceClassification` with as many outputs as the task needs (a new head when the saved one
has another size); its own tokenizer encodes the text (`tokenizer`).

The exported model (models/final) holds the fine-tuned weights as safetensors, the Transformers config inside
model.json and the tokenizer as tokenizer.json: predicting and serving it need neither the pretrained directory nor a
download (`HFSequenceModel` without `pretrained` builds the architecture from the config, then the weights load).

`HFSequenceModel.forward` is Transformers' own forward with the 2-D padding mask (the same function), for encoders
and decoders, SDPA and eager attention: it hands the model the 4-D mask Transformers would build (so no op reads the
device on the host), and a decoder reads its last real token, found by the mask.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainflow.core.errors import UserError

PREFIX = "hf:"
NAME = "hf"  # the model's name in its exported config (model.json)
# A numbered layer in a parameter's name: BERT's encoder.layer.3., Llama's layers.3., GPT-2's h.3., T5's block.3.
LAYER = re.compile(r"\.(?:layer|layers|h|block|blocks)\.(\d+)\.")


def is_hf(name: str) -> bool:
    return name.startswith(PREFIX)


def resolve(name: str, root: Path) -> Path:
    """The local directory `hf:<where>` names: a directory (relative to `root`), or a hub id's snapshot in the local
    Hugging Face cache. A clear error saying how to get the model when it is neither."""
    where = name[len(PREFIX) :].strip()
    path = (root / Path(where).expanduser()).resolve()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(
                f"model.name {name}: {path} has no config.json; give the directory that save_pretrained(...) wrote "
                "(the model and its tokenizer), e.g. model.save_pretrained(dir) and tokenizer.save_pretrained(dir)"
            )
        return path
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(where, local_files_only=True))
    except Exception:  # not in the cache, or not a hub id at all: the same advice
        raise UserError(
            f"model.name {name}: no directory {path}, and no model {where!r} in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); trainflow downloads nothing. On a machine with internet, save it with "
            f"`hf download {where}` (into the cache; copy the cache here) or with "
            f"AutoModelForSequenceClassification.from_pretrained({where!r}).save_pretrained(dir) and "
            f"AutoTokenizer.from_pretrained({where!r}).save_pretrained(dir), then set model.name: hf:dir"
        ) from None


@functools.cache
def _hash(directory: Path, listing: tuple[tuple[str, int, int], ...]) -> str:
    import hashlib

    h = hashlib.sha256()
    for rel, _, _ in listing:
        h.update(rel.encode() + b"\0")
        with open(directory / rel, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def directory_hash(directory: Path) -> str:
    """sha256 over the pretrained directory's files (names and bytes; hidden files left out). What resume checks and
    training.json records: other pretrained weights or another tokenizer are another model. Hashed once per process
    while no file changes (size and mtime)."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.parts))
    listing = tuple((p.relative_to(directory).as_posix(), (s := p.stat()).st_size, s.st_mtime_ns) for p in files)
    return _hash(directory, listing)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Transformers' own loading report off (trainflow says what matters: a new head); its warnings stay errors."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def _auto_config(directory: Path) -> Any:
    from transformers import AutoConfig

    with _quiet():
        return AutoConfig.from_pretrained(str(directory), local_files_only=True)


def config(directory: Path, classes: list[str], outputs: int, max_length: int) -> dict[str, Any]:
    """The model's part of model.json: the Transformers config (JSON) with the task's outputs and labels."""
    cfg = _auto_config(directory)
    limit = getattr(cfg, "max_position_embeddings", None)
    if isinstance(limit, int) and max_length > limit:
        raise UserError(
            f"features.max_length is {max_length} but {directory} takes at most {limit} tokens per sequence "
            f"(max_position_embeddings); set features.max_length <= {limit}"
        )
    cfg.num_labels = outputs
    cfg.id2label = {i: c for i, c in enumerate(classes)} if classes else {0: "value"}
    cfg.label2id = {c: i for i, c in cfg.id2label.items()}
    return {"hf_config": json.loads(cfg.to_json_string(use_diff=False))}


def tokenizer(directory: Path, max_length: int) -> tuple[Any, int]:
    """The pretrained model's own (fast) tokenizer as a `tokenizers.Tokenizer` truncating to `max_length` tokens (its
    special tokens included), and the id that pads its sequences."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    try:
        with _quiet():
            auto = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"model {directory}: its tokenizer cannot be loaded ({exc}); save it there with "
            "AutoTokenizer.from_pretrained(...).save_pretrained(dir)"
        ) from None
    if not getattr(auto, "is_fast", False):
        raise UserError(
            f"model {directory}: its tokenizer ({type(auto).__name__}) is not a fast one; trainflow needs "
            "tokenizer.json (save a fast tokenizer: AutoTokenizer.from_pretrained(..., use_fast=True)"
            ".save_pretrained(dir))"
        )
    tok = Tokenizer.from_str(auto.backend_tokenizer.to_str())
    tok.no_padding()  # batches are padded by the engine, to each batch's longest sequence
    tok.enable_truncation(max_length)
    pad = auto.pad_token_id
    # Without a pad token any id does (GPT-2's 0 is "!"): attention never sees a padded position (the mask), and a
    # decoder reads its last real token by the mask, not by this id (HFSequenceModel.forward).
    return tok, int(pad) if pad is not None else 0


# The masking_utils builders whose 4-D masks HFSequenceModel can build itself: full attention, causal or bidirectional,
# and sliding windows while a batch fits in the window (where the windowed mask is the full one).
PLAIN_MASKS = {"create_causal_mask", "create_bidirectional_mask", "create_sliding_window_causal_mask"}


def _self_attention_mask(model: Any) -> Callable[..., Any] | None:
    """Transformers' mask function for `model`'s self-attention (causal or bidirectional) when its masks are ones
    HFSequenceModel can build: the model (its base model's module) makes them with masking_utils' plain builders
    only, and runs the attention interface that takes a 4-D mask as it is. None otherwise (an encoder-decoder, local
    or recurrent attention, a model with its own mask code, a Transformers without masking_utils): that model gets
    the 2-D mask and builds its masks itself."""
    try:
        from transformers import masking_utils
    except ImportError:
        return None
    if "allow_is_bidirectional_skip" not in inspect.signature(masking_utils.sdpa_mask).parameters:
        return None  # an older masking_utils, whose skips cannot be turned off
    module = sys.modules[type(model.base_model).__module__]
    used = {name for name, obj in vars(module).items() if getattr(obj, "__module__", None) == masking_utils.__name__}
    config = model.config
    if not used or not used <= PLAIN_MASKS or getattr(config, "is_encoder_decoder", False):
        return None
    if not getattr(model, "_supports_attention_backend", False):
        return None
    # A model that builds only causal masks is a decoder; one that builds both (BERT's family, by config.is_decoder;
    # GPT-2, bidirectional for cross-attention) says so in its attention modules' `is_causal`, the flag Transformers'
    # own SDPA path reads when it passes no mask. config.is_causal = False makes a decoder bidirectional.
    decoder = "create_causal_mask" in used and (
        "create_bidirectional_mask" not in used or any(getattr(m, "is_causal", False) is True for m in model.modules())
    )
    if decoder and getattr(config, "is_causal", True):
        return masking_utils.causal_mask_function
    return masking_utils.bidirectional_mask_function


class HFSequenceModel(nn.Module):
    """A Transformers sequence classification model behind trainflow's text convention: forward(tokens, mask) ->
    logits [N, out_features]. With `pretrained` (a directory) it starts from those weights; without, from the config
    alone (the exported model: its weights load next)."""

    def __init__(self, out_features: int, hf_config: dict[str, Any], pretrained: str | None = None) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForSequenceClassification

        settings = {**hf_config, "num_labels": out_features}
        cfg = AutoConfig.for_model(**settings)
        with _quiet():
            if pretrained is None:
                model = AutoModelForSequenceClassification.from_config(cfg)
                new: list[str] = []
            else:
                model, info = AutoModelForSequenceClassification.from_pretrained(
                    pretrained, config=cfg, local_files_only=True, ignore_mismatched_sizes=True,
                    output_loading_info=True,
                )  # fmt: skip
                new = sorted({*info["missing_keys"], *(k[0] for k in info["mismatched_keys"])})
        if new:
            print(f"[trainflow] {pretrained}: new (randomly initialised) weights: {', '.join(new)}", flush=True)
        self.model = model.float()  # float32 master weights whatever the checkpoint's dtype (precision is autocast)
        self.out_features = out_features
        self.num_layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
        self.hidden_size = int(getattr(model.config, "hidden_size", 0) or 0)
        self.mask_function = _self_attention_mask(model)
        self.sliding_window = getattr(model.config, "sliding_window", None)
        # A decoder classifier (GPT-2's, OPT's, Llama's family: Transformers' GenericForSequenceClassification) applies
        # its `score` layer to every token and reads the last one that is not config.pad_token_id.
        encoder_decoder = getattr(model.config, "is_encoder_decoder", False)
        self.decoder = isinstance(getattr(model, "score", None), nn.Linear) and not encoder_decoder

    @property
    def packing(self) -> str | None:
        """train.packing's layout (TextData.pack): rows as wide as a batch's longest sequence, for a model whose 4-D
        masks this class builds (`_self_attention_mask`) under SDPA or eager attention, and whose classifier reads
        one token: a decoder's last (`score`), or an encoder's first through its `encoder` module (BERT's family).
        None: the model takes padded batches only."""
        if self.mask_function is None or self.sliding_window is not None:
            return None
        if self.model.config._attn_implementation not in ("sdpa", "eager"):
            return None
        return (
            "rows" if self.decoder or isinstance(getattr(self.model.base_model, "encoder", None), nn.Module) else None
        )

    def forward(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens and the 2-D mask [N, L] -> logits [N, out_features]; or packed (train.packing, TextData.pack):
        tokens, documents and positions [R, W], lengths [N] -> the same logits, each sequence's own."""
        if documents is not None:
            assert positions is not None and lengths is not None
            return self._packed(tokens, documents, positions, lengths)
        assert mask is not None
        attention = self._attention_mask(mask)
        if not self.decoder:
            logits: torch.Tensor = self.model(input_ids=tokens, attention_mask=attention).logits
            return logits
        # Transformers finds a decoder's last real token as the last one that is not config.pad_token_id: with none
        # (GPT-2) a batch > 1 fails, and a pad id that is also a real token (GPT-2's "!" is 0) moves it. The engine
        # pads on the right, so it is the mask's last True: found on the device. No cache: nothing generates here.
        hidden = self.model.base_model(input_ids=tokens, attention_mask=attention, use_cache=False).last_hidden_state
        last = mask.sum(dim=1) - 1
        logits = self.model.score(hidden[torch.arange(len(last), device=last.device), last])  # indices: no sync
        return logits

    def _packed(
        self, tokens: torch.Tensor, documents: torch.Tensor, positions: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        """Packed rows through Transformers' own modules: a 4-D mask in which a token sees the tokens of its own
        sequence only (and only earlier ones, for a decoder), position ids that restart at each sequence, then the
        classifier on each sequence's own token: a decoder's last, by `score`; an encoder's first, handed to the
        model's own pooler and head in place of the encoder's output (a forward hook), so the head is the model's.
        The tokens are found on the device (scatter_reduce over each token's flat index): no host sync."""
        rows, width = tokens.shape
        n = len(lengths)
        attention = (documents[:, :, None] == documents[:, None, :]).unsqueeze(1)  # [R, 1, W, W]
        if self.decoder:
            attention = attention & torch.ones(width, width, dtype=torch.bool, device=tokens.device).tril()
        if self.model.config._attn_implementation == "eager":  # added to the scores, as _attention_mask's
            dtype = self.model.get_input_embeddings().weight.dtype
            attention = torch.where(
                attention, torch.zeros((), device=tokens.device, dtype=dtype), torch.finfo(dtype).min
            )
        slot = torch.where(documents >= 0, documents, n).flatten()  # a row's padding: sequence n, dropped
        flat = torch.arange(rows * width, device=tokens.device)
        reduce = "amax" if self.decoder else "amin"  # a decoder's last token, an encoder's first
        start = torch.full((n + 1,), 0 if self.decoder else rows * width, device=tokens.device, dtype=flat.dtype)
        chosen = start.scatter_reduce(0, slot, flat, reduce)[:n]
        if self.decoder:
            hidden = self.model.base_model(
                input_ids=tokens, attention_mask=attention, position_ids=positions, use_cache=False
            ).last_hidden_state
            logits: torch.Tensor = self.model.score(hidden.flatten(0, 1)[chosen])
            return logits

        def first_tokens(_module: nn.Module, _args: Any, output: Any) -> Any:
            output["last_hidden_state"] = output["last_hidden_state"].flatten(0, 1)[chosen].unsqueeze(1)  # [N, 1, H]
            return output

        hook = self.model.base_model.encoder.register_forward_hook(first_tokens)
        try:
            logits = self.model(input_ids=tokens, attention_mask=attention, position_ids=positions).logits
        finally:
            hook.remove()
        return logits

    def _attention_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """The [N, 1, L, L] mask Transformers builds from the 2-D `mask` for this model and attention (booleans for
        SDPA, 0 / dtype-min added to the scores for eager; causal for a decoder), built with its own functions: a
        4-D mask it then uses as it is. Built from a 2-D mask, Transformers first asks the device whether the batch
        has padding at all (`mask.all()`, a host sync per forward) to pass no mask instead, the same function: here
        the mask is always there. Its cost: N*L*L elements, and SDPA never takes its flash kernel (which takes no mask).
        The 2-D mask itself for a model whose masks this cannot build (`_self_attention_mask`), and for a batch longer
        than the model's sliding window: there Transformers builds them (and under SDPA pays the sync)."""
        n, length = mask.shape
        if self.mask_function is None or (isinstance(self.sliding_window, int) and length > self.sliding_window):
            return mask
        from transformers import masking_utils

        implementation = self.model.config._attn_implementation
        if implementation not in ("sdpa", "eager"):  # flash and flex attention take other masks
            return mask
        attention: torch.Tensor | None = masking_utils.sdpa_mask(
            batch_size=n, q_length=length, kv_length=length, mask_function=self.mask_function,
            attention_mask=mask.bool(), allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
            device=mask.device,
        )  # fmt: skip
        assert attention is not None  # None only where a skip is allowed
        if implementation == "eager":
            # What masking_utils.eager_mask does, without the host sync its Transformers <= 5.17 versions pay there
            # (`torch.tensor(0.0, device=...)`: a blocking copy from the host, caught on an H200 by the GPU tier).
            dtype = self.model.get_input_embeddings().weight.dtype
            attention = torch.where(attention, torch.zeros((), device=mask.device, dtype=dtype), torch.finfo(dtype).min)
        return attention

    def layer_of(self, name: str) -> int:
        """train.layer_decay's layer of a parameter: 0 the embeddings, 1..num_layers the numbered layers, num_layers + 1
        the rest (pooler, head), which learns at the scheduled rate."""
        if ".embeddings." in name or "embed_tokens" in name or ".wte." in name or ".wpe." in name:
            return 0
        found = LAYER.search(name)
        return int(found.group(1)) + 1 if found else self.num_layers + 1

    def activation_checkpointing(self, on: bool) -> None:
        """Recompute each layer's activations in backward instead of keeping them (Transformers' own checkpointing,
        non-reentrant: it keeps the RNG state, so dropout masks are the same)."""
        # Transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_* (the old names warn).
        newer = hasattr(self.model, "activation_checkpointing_enable")
        if not on:
            (self.model.activation_checkpointing_disable if newer else self.model.gradient_checkpointing_disable)()
            return
        if not getattr(self.model, "supports_gradient_checkpointing", False):
            raise UserError(f"{type(self.model).__name__} does not support activation checkpointing")
        kwargs = {"use_reentrant": False}
        if newer:
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, as for trainflow's text transformer: 6 * non-embedding params + 12 * layers *
        hidden size * seq_len."""
        embedding = sum(p.numel() for n, p in self.named_parameters() if self.layer_of(n) == 0)
        params = sum(p.numel() for p in self.parameters()) - embedding
        return float(6 * params + 12 * self.num_layers * self.hidden_size * seq_len)
