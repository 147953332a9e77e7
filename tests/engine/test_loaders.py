"""The engine's datasets (trainflow/engine/loaders.py) pinned whole, against values written out by hand: the order
of an epoch (by rows or by blocks), every tensor a batch holds (tables, memory-mapped tables, text with its padding
and masks, images decoded ahead or on demand), every count and message, subsets, devices, and which images the
prefetch thread decodes ahead."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trainflow.engine.loaders import (
    IGNORE_INDEX,
    Batch,
    ImageData,
    MemmapData,
    RowFile,
    TensorData,
    TextData,
    _to,
    block_order,
    epoch_order,
)


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


T = torch.tensor


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


# --- the order of an epoch ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (0, 3), (2, 1), (7, 5)])
def test_epoch_order_is_randperm_of_a_generator_seeded_seed_times_1000003_plus_epoch(seed: int, epoch: int) -> None:
    expected = torch.randperm(9, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
    assert same(epoch_order(9, seed, epoch), expected)


@pytest.mark.parametrize(("n", "seed", "epoch"), [(3000, 0, 0), (3000, 7, 2), (2048, 1, 1), (50, 3, 0), (0, 0, 0)])
def test_block_order_mixes_the_rows_of_each_16_blocks_of_64_in_the_randperm_order_of_the_blocks(
    n: int, seed: int, epoch: int
) -> None:
    """train.shuffle blocks, from its definition: the blocks (64 rows; the last one shorter) in the order of randperm
    from the (seed, epoch) generator, each run of 16 of them filling consecutive positions, their rows mixed."""
    order = block_order(n, seed, epoch)
    assert order.dtype == torch.int64 and sorted(order.tolist()) == list(range(n))
    assert torch.equal(order, block_order(n, seed, epoch))
    blocks = torch.randperm(-(-n // 64), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
    at = 0
    for first in range(0, len(blocks), 16):
        rows = {r for b in blocks[first : first + 16] for r in range(64 * b, min(n, 64 * b + 64))}
        got = order[at : at + len(rows)].tolist()
        assert set(got) == rows
        if len(rows) == 1024:  # mixed: not the blocks one after another
            assert [r // 64 for r in got[:64]] != [got[0] // 64] * 64
        at += len(rows)
    assert at == n
    if n:
        assert not torch.equal(order, block_order(n, seed, epoch + 1))


# --- tables ------------------------------------------------------------------------------------------------------


def test_a_table_batch_gathers_its_rows_and_counts_them() -> None:
    x = T([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]])
    data = TensorData(x, T([1, 0, 1, 0]), "cpu")
    assert len(data) == 4 and data.index_device == data.device == torch.device("cpu")
    b = data.batch(T([3, 1]))
    assert same(b.inputs["x"], T([[6.0, 7.0], [2.0, 3.0]])) and same(b.target, T([0, 0]))
    assert (b.count, b.size, list(b.inputs)) == (2, 2, ["x"])
    assert (data.count(T([0, 1, 2])), data.tokens(T([0, 1, 2]))) == (3, 0)
    sub = data.subset(T([2, 0]))
    assert isinstance(sub, TensorData) and same(sub.x, T([[4.0, 5.0], [0.0, 1.0]])) and same(sub.y, T([1, 1]))
    data.to(torch.device("meta"))
    assert data.device == data.index_device == torch.device("meta") and data.x.device.type == "meta"
    assert data.y.device.type == "meta"


@pytest.mark.parametrize("kind", [TensorData, MemmapData])
def test_a_table_whose_x_and_y_differ_in_length_is_refused(kind: type) -> None:
    with pytest.raises(ValueError) as exc:
        kind(np.zeros((3, 2), np.float32) if kind is MemmapData else torch.zeros(3, 2), torch.zeros(2).numpy())
    assert str(exc.value) == "x has 3 rows but y has 2"


def test_a_memory_mapped_table_gathers_the_same_rows_as_a_tensor_one(tmp_path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    y = np.array([0, 1, 2, 0, 1, 2])
    np.save(tmp_path / "x.npy", x)
    data = MemmapData(np.load(tmp_path / "x.npy", mmap_mode="r"), y, "cpu")
    assert len(data) == 6 and data.index_device == torch.device("cpu") and data.device == torch.device("cpu")
    b = data.batch(T([5, 0, 2]))
    assert same(b.inputs["x"], T([[10.0, 11.0], [0.0, 1.0], [4.0, 5.0]])) and same(b.target, T([2, 0, 2]))
    assert b.count == 3 and (data.count(T([1, 2])), data.tokens(T([1, 2]))) == (2, 0)
    b.inputs["x"][0, 0] = -1.0  # a copy: writable, and the file's pages are untouched
    assert data.x.array[5, 0] == 10.0
    sub = data.subset(T([4, 1]))
    assert isinstance(sub, TensorData) and same(sub.x, T([[8.0, 9.0], [2.0, 3.0]])) and same(sub.y, T([1, 1]))
    data.to(torch.device("meta"))
    assert data.device == torch.device("meta") and data.index_device == torch.device("cpu")
    assert data.batch(T([0])).inputs["x"].device.type == "meta" and isinstance(data.x.array, np.memmap)


def test_rows_are_read_from_the_file_at_the_views_own_offset_and_a_truncated_file_is_named(tmp_path) -> None:
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.save(tmp_path / "x.npy", x)
    mapped = np.load(tmp_path / "x.npy", mmap_mode="r")
    rows = RowFile(mapped[3:])  # a view: its first row is row 3 of the file
    assert rows.fd is not None and len(rows) == 7
    got = rows.take(np.array([6, 0, 2, 2]))
    assert got.flags.writeable and got.dtype == np.float32 and np.array_equal(got, x[[9, 3, 5, 5]])
    assert np.array_equal(RowFile(x).take(np.array([1])), x[[1]]) and RowFile(x).fd is None  # in memory: indexed
    with open(tmp_path / "x.npy", "r+b") as f:
        f.truncate(f.seek(0, 2) - 8)  # the last row's second half gone
    with pytest.raises(ValueError) as exc:
        rows.take(np.array([6]))
    assert str(exc.value) == f"{tmp_path / 'x.npy'} is shorter than its header says: was it truncated?"


def test_rows_are_read_with_one_pread_per_run_of_consecutive_rows(tmp_path, monkeypatch) -> None:
    import trainflow.engine.loaders as data

    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.save(tmp_path / "x.npy", x)
    rows = RowFile(np.load(tmp_path / "x.npy", mmap_mode="r"))
    reads: list[tuple[int, int]] = []
    pread = data.os.pread

    def counted(fd: int, size: int, offset: int) -> bytes:
        reads.append((size, offset))
        return pread(fd, size, offset)

    monkeypatch.setattr(data.os, "pread", counted)
    idx = np.array([6, 7, 5, 1, 2, 19, 6, 0])  # runs 0-2, 5-6, 6-7 (6 twice), 19
    got = rows.take(idx)
    assert got.flags.writeable and np.array_equal(got, x[idx])
    row = 3 * 4
    assert [size // row for size, _ in reads] == [3, 2, 2, 1]
    assert rows.take(np.array([], dtype=np.int64)).shape == (0, 3) and len(reads) == 4
    reads.clear()
    data_ = MemmapData(np.load(tmp_path / "x.npy", mmap_mode="r"), np.zeros(20, np.int64))
    data_.shuffle = "blocks"
    order = data_.epoch_order(3, 1)
    assert order.tolist() == block_order(20, 3, 1).tolist()
    assert same(data_.batch(order[:8]).inputs["x"], torch.from_numpy(x[order[:8].numpy()]))


@pytest.mark.parametrize("micro", [64, 1000, 1024])
def test_an_epoch_in_blocks_order_reads_each_block_once_whatever_the_micro_batch(tmp_path, monkeypatch, micro) -> None:
    """train.shuffle blocks: micro-batches smaller than a group of 16 blocks of 64 rows still read whole blocks, each
    once an epoch (kept for the group's next micro-batches), and get the rows asked for (numpy's own indexing)."""
    import trainflow.engine.loaders as data

    n = 4096 + 40  # 64 blocks and a short one
    x = np.random.default_rng(0).standard_normal((n, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    read: list[int] = []
    pread = data.os.pread

    def counted(fd: int, size: int, offset: int) -> bytes:
        read.append(size // 12)
        return pread(fd, size, offset)

    monkeypatch.setattr(data.os, "pread", counted)
    table = MemmapData(np.load(tmp_path / "x.npy", mmap_mode="r"), np.arange(n))
    table.shuffle = "blocks"
    order = table.epoch_order(5, 0)
    for lo in range(0, n, micro):
        idx = order[lo : lo + micro]
        b = table.batch(idx)
        assert same(b.inputs["x"], torch.from_numpy(x[idx.numpy()])) and same(b.target, idx)
    assert sum(read) == n and len(read) <= 65  # every row read once, a read per block at most
    assert len(table.blocks.blocks) <= 32


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's RSS from /proc")
def test_reading_every_row_of_a_memory_mapped_table_keeps_its_pages_out_of_the_process(tmp_path) -> None:
    """The guarantee behind a streamed training's bounded memory: gathering through the memory map would map the
    pages of the whole file into the process (RssFile grows by about the file's 64 MiB); read rows are copies."""

    def rss_file_mib() -> float:
        line = next(s for s in Path("/proc/self/status").read_text().splitlines() if s.startswith("RssFile"))
        return int(line.split()[1]) / 1024

    n, width = 1 << 16, 256  # 64 MiB of float32
    x = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(n, width))
    x[:] = np.arange(width, dtype=np.float32)
    x.flush()
    del x
    y = np.zeros(n, np.int64)
    data = MemmapData(np.load(tmp_path / "x.npy", mmap_mode="r"), y)
    order = data.epoch_order(0, 0)
    before = rss_file_mib()
    for lo in range(0, n, 4096):
        batch = data.batch(order[lo : lo + 4096])
        assert batch.inputs["x"][0, 7] == 7.0
    assert rss_file_mib() - before < 16


def test_a_memory_mapped_table_reads_the_next_window_of_the_epochs_order_ahead(tmp_path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.save(tmp_path / "x.npy", x)
    data = MemmapData(np.load(tmp_path / "x.npy", mmap_mode="r"), np.arange(6))
    order = data.epoch_order(3, 1)
    assert order.tolist() == epoch_order(6, 3, 1).tolist()
    first = data.batch(order[:2])
    assert data.ahead._next is not None and data.ahead._next[0].tolist() == order[2:4].tolist()
    second = data.batch(order[2:4])  # the one read ahead
    for b, rows in ((first, order[:2]), (second, order[2:4])):
        assert same(b.inputs["x"], torch.from_numpy(x[rows.numpy()])) and same(b.target, rows)


# --- text --------------------------------------------------------------------------------------------------------


def test_a_text_batch_pads_to_its_longest_sequence_and_masks_the_padding() -> None:
    seqs = [T([5, 6, 7]), T([8]), T([9, 10]), T([11, 12, 13, 14])]
    data = TextData(seqs, T([0, 1, 0, 1]), pad_id=3, bucket=1)
    assert len(data) == 4 and data.index_device == torch.device("cpu") and not data.per_token
    b = data.batch(T([1, 2, 0]))
    assert same(b.inputs["tokens"], T([[8, 3, 3], [9, 10, 3], [5, 6, 7]]))
    assert same(b.inputs["mask"], T([[True, False, False], [True, True, False], [True, True, True]]))
    assert same(b.target, T([1, 0, 0])) and b.count == 3
    assert (data.count(T([3, 1])), data.tokens(T([3, 1])), data.tokens(T([0, 1, 2, 3]))) == (2, 5, 10)
    # the last sequence padded: its gather reaches past the end of the flat tokens, clamped there
    b = data.batch(T([3, 1]))
    assert same(b.inputs["tokens"], T([[11, 12, 13, 14], [8, 3, 3, 3]]))
    empty = data.batch(T([], dtype=torch.long))  # a rank with no samples left
    assert empty.inputs["tokens"].shape == (0, 1) and empty.count == 0


def test_per_token_targets_are_padded_with_the_ignore_index_and_count_labelled_tokens() -> None:
    seqs = [T([1, 2, 3]), T([4]), T([5, 6])]
    targets = [T([7, IGNORE_INDEX, 8]), T([IGNORE_INDEX]), T([9, 9])]
    data = TextData(seqs, targets, pad_id=0, bucket=1)
    assert data.per_token
    b = data.batch(T([0, 1, 2]))
    assert same(b.target, T([[7, -100, 8], [-100, -100, -100], [9, 9, -100]]))
    assert b.count == 4 and data.count(T([1])) == 0 and data.count(T([0, 2])) == 4
    sub = data.subset(T([2, 0]))
    assert sub.per_token and [s.tolist() for s in sub.sequences] == [[5, 6], [1, 2, 3]]
    assert [t.tolist() for t in sub.token_targets] == [[9, 9], [7, -100, 8]] and (sub.pad_id, sub.bucket) == (0, 1)


def test_a_text_subset_keeps_pad_id_bucket_device_and_targets() -> None:
    data = TextData([T([1]), T([2, 3]), T([4, 5, 6])], T([0.5, 1.5, 2.5]), pad_id=9, bucket=7)
    sub = data.subset(T([2, 0]))
    assert not sub.per_token and same(sub.targets, T([2.5, 0.5])) and (sub.pad_id, sub.bucket) == (9, 7)
    assert [s.tolist() for s in sub.sequences] == [[4, 5, 6], [1]] and sub.device == torch.device("cpu")
    data.to(torch.device("meta"))
    assert data.device == torch.device("meta") and data.flat.device.type == "cpu"
    b = data.batch(T([0]))
    assert b.inputs["tokens"].device.type == b.inputs["mask"].device.type == b.target.device.type == "meta"


@pytest.mark.parametrize(
    ("seqs", "targets", "said"),
    [
        ([T([1]), T([2])], T([0]), "2 sequences but 1 targets"),
        ([T([1]), T([], dtype=torch.long)], T([0, 1]), "every sequence needs at least one token"),
        ([T([1, 2]), T([3])], [T([0, 0]), T([0, 0])], "sequence 1 has 1 tokens but 2 targets"),
    ],
)
def test_bad_text_data_is_refused_naming_the_sequence(seqs: list, targets: object, said: str) -> None:
    with pytest.raises(ValueError) as exc:
        TextData(seqs, targets)  # type: ignore[arg-type]
    assert str(exc.value) == said


def test_bucketed_order_sorts_each_run_of_bucket_samples_longest_first_keeping_ties_in_order() -> None:
    lengths = [2, 5, 1, 5, 3, 4, 1]
    data = TextData([torch.ones(n, dtype=torch.long) for n in lengths], T([0] * 7), bucket=3)
    order = epoch_order(7, 4, 2).tolist()
    expected = []
    for start in range(0, 7, 3):
        chunk = order[start : start + 3]
        expected += sorted(chunk, key=lambda i: -lengths[i])  # sorted() is stable: ties keep the epoch's order
    assert data.epoch_order(4, 2).tolist() == expected
    unbucketed = TextData([torch.ones(n, dtype=torch.long) for n in lengths], T([0] * 7), bucket=1)
    assert unbucketed.epoch_order(4, 2).tolist() == order
    assert TextData([T([1])], T([0])).bucket == 1024


# --- images ------------------------------------------------------------------------------------------------------

PIXELS = torch.arange(6 * 2 * 1 * 2, dtype=torch.uint8).reshape(6, 2, 1, 2)  # 6 images, 2 channels, 1 x 2


TARGETS = T([0, 1, 2, 0, 1, 2])


MEAN, STD = [1.0, 2.0], [2.0, 4.0]


def normalised(rows: list[int]) -> torch.Tensor:
    x = PIXELS[rows].float()
    return (x - T(MEAN)[None, :, None, None]) / T(STD)[None, :, None, None]


def test_decoded_images_are_gathered_and_normalised_per_channel() -> None:
    data = ImageData(PIXELS, TARGETS, MEAN, STD)
    assert len(data) == 6 and data.decoded and data.index_device == torch.device("cpu")
    b = data.batch(T([4, 1]))
    assert same(b.inputs["images"], normalised([4, 1])) and same(b.target, T([1, 1])) and b.count == 2
    # image 1, channel 1 holds 6, 7: (6 - 2) / 4 and (7 - 2) / 4, by hand
    assert b.inputs["images"][1, 1, 0].tolist() == [1.0, 1.25]
    assert (data.count(T([1, 2, 3])), data.tokens(T([1, 2, 3]))) == (3, 0)
    assert data.epoch_order(3, 1).tolist() == epoch_order(6, 3, 1).tolist() and (data.seed, data.epoch) == (3, 1)
    sub = data.subset(T([5, 0]))
    assert same(sub.images, PIXELS[[5, 0]]) and same(sub.targets, T([2, 0]))  # type: ignore[arg-type]
    assert (sub.mean, sub.std, sub.augment, sub.device) == (MEAN, STD, None, torch.device("cpu"))


@pytest.mark.parametrize(
    ("images", "targets"),
    [(PIXELS, TARGETS[:5]), (PIXELS[:, 0], TARGETS)],
)
def test_decoded_images_of_another_shape_are_refused(images: torch.Tensor, targets: torch.Tensor) -> None:
    with pytest.raises(ValueError) as exc:
        ImageData(images, targets, MEAN, STD)
    assert str(exc.value) == f"images {tuple(images.shape)} must be [N, C, H, W] with N = {len(targets)} targets"


class Decoder:
    """decode(indices) for ImageData: records each call."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, rows: list[int]) -> torch.Tensor:
        self.calls.append(list(rows))
        return PIXELS[rows]


def test_images_decoded_on_demand_prefetch_the_next_window_of_the_epochs_order() -> None:
    decode = Decoder()
    data = ImageData(decode, TARGETS, MEAN, STD)
    assert not data.decoded and data.index_device == torch.device("cpu")
    order = data.epoch_order(5, 0)
    assert order.tolist() == epoch_order(6, 5, 0).tolist()
    first = data.batch(order[0:2])
    assert same(first.inputs["images"], normalised(order[0:2].tolist()))
    assert same(first.target, TARGETS[order[0:2]])
    assert data.ahead._next is not None and data.ahead._next[0].tolist() == order[2:4].tolist()
    data.ahead._next[2].result()
    assert decode.calls == [order[0:2].tolist(), order[2:4].tolist()]  # this window, then the next ahead
    second = data.batch(order[2:4])  # the prefetched one: not decoded again
    assert same(second.inputs["images"], normalised(order[2:4].tolist()))
    data.ahead._next[2].result()  # type: ignore[index]
    assert decode.calls[2:] == [order[4:6].tolist()]
    data.batch(order[4:6])  # the last window: nothing follows it
    assert data.ahead._next is None and len(decode.calls) == 3
    other = T([order[1].item(), order[0].item()])  # not a run of the order (a rank's shard): made on the spot
    data.batch(other)
    assert decode.calls[3:] == [other.tolist()] and data.ahead._next is None


def test_evaluation_prefetches_in_index_order_and_a_new_epoch_drops_what_was_prefetched() -> None:
    decode = Decoder()
    data = ImageData(decode, TARGETS, MEAN, STD)
    data.batch(T([0, 1, 2, 3]))  # no epoch order asked for: index order, windows of 4
    assert data.ahead._next is not None and data.ahead._next[0].tolist() == [4, 5]  # the rest: a shorter window
    data.ahead._next[2].result()
    data.batch(T([4, 5]))
    assert decode.calls == [[0, 1, 2, 3], [4, 5]] and data.ahead._next is None
    assert data.ahead._following(T([1, 3])) is None and data.ahead._following(T([], dtype=torch.long)) is None
    assert data.ahead._following(T([2, 3])).tolist() == [4, 5]  # type: ignore[union-attr]
    data.batch(T([0, 1]))
    assert data.ahead._next is not None
    data.epoch_order(1, 1)
    assert data.ahead._next is None and data.ahead._position is not None
    assert [int(data.ahead._position[i]) for i in data.ahead._order.tolist()] == list(range(6))  # type: ignore[union-attr]


def test_a_prefetched_batch_of_another_epoch_is_made_again() -> None:
    decode = Decoder()
    data = ImageData(decode, TARGETS, MEAN, STD)
    order = data.epoch_order(0, 0)
    data.batch(order[0:3])
    data.ahead._next[2].result()  # type: ignore[index]
    data.epoch = 1  # the same indices asked for in another epoch: the prefetched batch is epoch 0's
    data.batch(order[3:6])
    assert decode.calls == [order[0:3].tolist(), order[3:6].tolist(), order[3:6].tolist()]


def test_an_image_subset_of_decoded_on_demand_images_decodes_the_original_rows() -> None:
    decode = Decoder()
    data = ImageData(decode, TARGETS, MEAN, STD)
    sub = data.subset(T([4, 2, 0]))
    assert len(sub) == 3 and same(sub.targets, T([1, 2, 0]))
    b = sub.batch(T([2, 0]))
    assert decode.calls[0] == [0, 4] and same(b.inputs["images"], normalised([0, 4]))


def test_to_moves_decoded_images_and_the_scale_and_leaves_decoded_on_demand_on_the_host() -> None:
    data = ImageData(PIXELS, TARGETS, MEAN, STD)
    data.to(torch.device("meta"))
    assert data.images.device.type == data.targets.device.type == "meta"  # type: ignore[union-attr]
    assert data.index_device == torch.device("meta") and all(t.device.type == "meta" for t in data._scale)
    lazy = ImageData(Decoder(), TARGETS, MEAN, STD)
    lazy.to(torch.device("meta"))
    assert lazy.index_device == torch.device("cpu") and lazy.targets.device.type == "cpu"
    assert all(t.device.type == "meta" for t in lazy._scale) and all(t.device.type == "cpu" for t in lazy._host_scale)
    b = lazy.batch(T([0, 1]))  # normalised on the host with the host's scale, then moved
    assert b.inputs["images"].device.type == "meta" and b.target.device.type == "meta"


def test_a_batch_knows_its_size_from_its_target() -> None:
    assert Batch({}, T([1, 2, 3]), count=9).size == 3


def test_to_copies_to_a_cpu_device_without_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    t = T([1.0])
    assert _to(t, torch.device("cpu")) is t
    calls: list[str] = []

    class Pinned:
        def to(self, device: torch.device, non_blocking: bool = False) -> str:
            calls.append(f"to {device} non_blocking={non_blocking}")
            return "moved"

    class Host:
        def pin_memory(self) -> Pinned:
            calls.append("pin")
            return Pinned()

    assert _to(Host(), torch.device("cuda", 1)) == "moved"  # type: ignore[arg-type]
    assert calls == ["pin", "to cuda:1 non_blocking=True"]


def test_augmented_images_are_flipped_per_sample_as_a_function_of_seed_epoch_and_index() -> None:
    """flip only: each image comes out as itself or mirrored left-right (then normalised), the same whichever batch
    it is in; the epoch's (seed, epoch), set by epoch_order, decides which."""
    from trainflow.engine.augment import Augment

    data = ImageData(PIXELS, TARGETS, MEAN, STD, augment=Augment(flip=True))
    plain, mirrored = normalised(list(range(6))), normalised(list(range(6))).flip(-1)
    flips = []
    for epoch in range(3):
        data.epoch_order(9, epoch)
        whole = data.batch(torch.arange(6)).inputs["images"]
        flipped = [bool(torch.equal(whole[i], mirrored[i])) for i in range(6)]
        assert all(flipped[i] or torch.equal(whole[i], plain[i]) for i in range(6))
        assert torch.equal(data.batch(T([5, 2])).inputs["images"], whole[[5, 2]])  # another batch: the same images
        flips.append(flipped)
    assert any(any(f) for f in flips) and any(not all(f) for f in flips) and flips[0] != flips[1]


def test_tensor_data_puts_features_and_targets_on_its_device() -> None:
    """Both on the training device (the meta device stands in for a GPU: a tensor left on the CPU keeps device cpu)."""
    data = TensorData(torch.zeros(4, 3), torch.arange(4), device="meta")
    assert (data.x.device.type, data.y.device.type, data.device.type) == ("meta", "meta", "meta")
