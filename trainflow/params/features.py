"""features: the preprocessing fitted on the train split, and image augmentation."""

from __future__ import annotations

from pydantic import Field, field_validator

from trainflow.params.base import Section


class AugmentParams(Section):
    """Random changes to each train image, per sample and epoch (features.augment)."""

    shift: int = Field(
        0,
        ge=0,
        description="Pad by this many pixels (zeros) and crop back at a random offset: shifts of up to +-shift pixels.",
    )
    flip: bool = Field(False, description="Mirror left-right with probability 1/2 (off for digits and text).")
    rotate: float = Field(0.0, ge=0, le=180, description="Rotate by a random angle in [-rotate, rotate] degrees.")


class FeatureParams(Section):
    """Preprocessing, fitted on the train split by the train stage and saved with the model."""

    max_categories: int = Field(
        50,
        ge=1,
        description="Categorical columns become one-hot columns for the categories most frequent in train, at most "
        "this many per column; rarer ones and ones never seen in train share an `unknown` column.",
    )
    missing_indicators: bool = Field(
        True, description="Add a 0/1 column per numeric feature that had missing values in train."
    )
    vocab_size: int = Field(
        8000, ge=100, description="Text: subword vocabulary size of the tokenizer (hf: models bring their own)."
    )
    max_length: int = Field(
        128,
        ge=8,
        description="Text: tokens kept per text (longer texts are truncated); with an hf: model, its special tokens "
        "included.",
    )
    image_size: int | list[int] | None = Field(
        None,
        description="Images: [height, width] (or one number for squares) every image is resized to (bilinear); "
        "null = keep the train images' size, which must then be the same for all (a different one is an error "
        "naming the file).",
    )
    augment: AugmentParams = Field(
        default_factory=lambda: AugmentParams.model_validate({}),
        description="Images: random augmentation of the train split only (drawn per sample from seed, epoch and "
        "sample index, so a resumed run is bit-identical); off by default.",
    )

    @field_validator("image_size")
    @classmethod
    def _size(cls, v: int | list[int] | None) -> int | list[int] | None:
        sizes = [v] if isinstance(v, int) else v
        if sizes is not None and (len(sizes) != 2 and not isinstance(v, int) or any(s < 1 for s in sizes)):
            raise ValueError(f"must be null, a positive number or [height, width] of positive numbers, got {v!r}")
        return v
