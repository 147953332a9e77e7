"""The base of every params section: unknown keys refused, defaults validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # coerce_numbers_to_str: a column named 1 is the text "1" (`-S data.target=1` is YAML's integer 1, as is
    # `target: 1` in params.yaml); without it pydantic answers "Input should be a valid string".
    model_config = ConfigDict(extra="forbid", validate_default=True, coerce_numbers_to_str=True)
