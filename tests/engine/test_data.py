"""The engine's datasets, checked against values written out by hand: padding, counts, subsets, bucketed orders."""

from __future__ import annotations

import pytest
import torch

from trainflow.engine.loaders import IGNORE_INDEX, TensorData, TextData, epoch_order


def seqs() -> list[torch.Tensor]:
    return [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10]), torch.tensor([11, 12, 13, 14])]


def test_a_text_batch_is_padded_to_its_longest_sequence_with_pad_id() -> None:
    data = TextData(seqs(), torch.tensor([0, 1, 0, 1]), pad_id=3)
    b = data.batch(torch.tensor([1, 0, 3]))
    assert b.inputs["tokens"].tolist() == [[8, 3, 3, 3], [5, 6, 7, 3], [11, 12, 13, 14]]
    assert b.inputs["mask"].tolist() == [[True, False, False, False], [True, True, True, False], [True] * 4]
    assert b.target.tolist() == [1, 0, 1] and b.count == 3 and data.tokens(torch.tensor([1, 0, 3])) == 8
    assert TextData(seqs(), torch.tensor([0, 1, 0, 1])).batch(torch.tensor([1, 2])).inputs["tokens"].tolist() == [
        [8, 0],
        [9, 10],
    ]  # the default pad id is 0


def test_per_token_targets_count_labelled_tokens_only() -> None:
    targets = [
        torch.tensor([1, IGNORE_INDEX, 2]),
        torch.tensor([0]),
        torch.tensor([IGNORE_INDEX, 1]),
        torch.tensor([3, 3, 3, 3]),
    ]
    data = TextData(seqs(), targets)
    b = data.batch(torch.tensor([2, 0]))
    assert b.target.tolist() == [[IGNORE_INDEX, 1, IGNORE_INDEX], [1, IGNORE_INDEX, 2]]
    assert b.count == 3 == data.count(torch.tensor([2, 0]))  # 1 + 2 labelled tokens
    assert data.count(torch.tensor([3, 1])) == 5
    empty = data.batch(torch.tensor([], dtype=torch.long))  # a rank with nothing left in a window
    assert empty.count == 0 and empty.inputs["tokens"].shape == (0, 1)


@pytest.mark.parametrize("per_token", [False, True])
def test_a_text_subset_keeps_its_rows_and_settings(per_token: bool) -> None:
    targets: torch.Tensor | list[torch.Tensor] = (
        [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6]), torch.tensor([7, 8, 9, 0])]
        if per_token
        else torch.tensor([10, 11, 12, 13])
    )
    data = TextData(seqs(), targets, pad_id=4, bucket=1, device="meta")
    sub = data.subset(torch.tensor([3, 1]))
    assert (sub.pad_id, sub.bucket, sub.device, len(sub)) == (4, 1, torch.device("meta"), 2)
    sub.to(torch.device("cpu"))
    b = sub.batch(torch.tensor([1, 0]))
    assert b.inputs["tokens"].tolist() == [[8, 4, 4, 4], [11, 12, 13, 14]]
    expected = [[4, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX], [7, 8, 9, 0]] if per_token else [11, 13]
    assert b.target.tolist() == expected


def test_text_batches_go_to_the_dataset_device() -> None:
    data = TextData(seqs(), torch.tensor([0, 1, 0, 1]), device="meta")
    assert data.index_device == torch.device("cpu")  # padding happens on the host
    b = data.batch(torch.tensor([0, 1]))
    assert b.inputs["tokens"].device.type == b.inputs["mask"].device.type == b.target.device.type == "meta"


def test_bad_text_data_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="^4 sequences but 3 targets$"):
        TextData(seqs(), torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match="^every sequence needs at least one token$"):
        TextData([*seqs()[:3], torch.tensor([], dtype=torch.long)], torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="^sequence 1 has 1 tokens but 2 targets$"):
        TextData(seqs(), [torch.tensor([1, 2, 3]), torch.tensor([1, 2]), torch.tensor([1, 2]), torch.tensor([1] * 4)])
    with pytest.raises(ValueError, match="^x has 3 rows but y has 2$"):
        TensorData(torch.zeros(3, 2), torch.zeros(2))


def test_bucketed_order_sorts_each_bucket_longest_first_stably() -> None:
    lengths = [2, 5, 2, 1, 5, 3, 2, 4]
    data = TextData([torch.ones(k, dtype=torch.long) for k in lengths], torch.zeros(8, dtype=torch.long), bucket=4)
    base = epoch_order(8, 3, 1).tolist()
    expected = []
    for start in (0, 4):
        chunk = base[start : start + 4]
        expected += sorted(chunk, key=lambda i: -lengths[i])  # Python's sort is stable: ties keep their order
    assert data.epoch_order(3, 1).tolist() == expected
    assert TextData(data.sequences, torch.zeros(8, dtype=torch.long), bucket=1).epoch_order(3, 1).tolist() == base


def test_a_table_subset_stays_on_its_device() -> None:
    data = TensorData(torch.arange(12.0).reshape(6, 2), torch.arange(6), device="meta")
    sub = data.subset(torch.tensor([4, 1], device="meta"))
    assert sub.device == torch.device("meta") and len(sub) == 2 and sub.x.device.type == "meta"
    cpu = TensorData(torch.arange(12.0).reshape(6, 2), torch.arange(6))
    assert cpu.subset(torch.tensor([4, 1])).y.tolist() == [4, 1] and cpu.count(torch.tensor([4, 1])) == 2
