"""evaluate: scoring the test split."""

from __future__ import annotations

from pydantic import Field

from trainflow.params.base import Section


class EvaluateParams(Section):
    batch_size: int = Field(
        1024,
        ge=1,
        description="Rows per forward pass when scoring the test split. 1024 is also what `trainflow predict` and the "
        "served model use, so their outputs match evaluate's bit for bit.",
    )
