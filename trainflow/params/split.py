"""split: the train/val/test split."""

from __future__ import annotations

from pydantic import Field, model_validator

from trainflow.params.base import Section


class SplitParams(Section):
    val_fraction: float = Field(0.15, gt=0, lt=1, description="Fraction of rows held out for validation.")
    test_fraction: float = Field(0.15, gt=0, lt=1, description="Fraction of rows held out for the final test.")
    stratify: bool = Field(
        True,
        description="Classification: split each class in the given fractions, within one row (a class too small "
        "for val and test stays in train, with a warning); still stable under appended rows.",
    )
    key: list[str] | None = Field(
        None,
        description="Columns whose seeded hash keys a row (an id); null = the hash of the whole row. Each key's split "
        "is saved with the splits, so a row keeps its split when new rows are appended.",
    )
    group_by: str | None = Field(
        None,
        description="Column of group ids (a user, a patient): all rows of a group land in the same split (stratified "
        "by each group's most frequent class).",
    )
    time_column: str | None = Field(
        None,
        description="Column of timestamps (or numbers, or text that parses as one or the other): train on the oldest "
        "rows, validate on later ones, test on the newest; equal timestamps never straddle a boundary (overrides "
        "key/group_by/stratify).",
    )
    seed: int = Field(
        42,
        ge=0,
        description="Seed of the row keys' hash, which decides which rows are train, val and test. The split's own: "
        "the top-level seed is the training seed and never moves a row between splits. Changing this one assigns "
        "every row afresh, so the champion may have trained on this split's test rows: the gate then compares the "
        "two only on rows the champion's split held out, or keeps the champion and says why.",
    )

    @model_validator(mode="after")
    def _leaves_rows_to_train_on(self) -> SplitParams:
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ValueError(
                f"split.val_fraction + split.test_fraction = {self.val_fraction + self.test_fraction:g} leaves "
                "under 10% of the rows to train on; lower one of them"
            )
        return self
