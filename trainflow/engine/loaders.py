"""What the engine trains on: datasets that turn a tensor of sample indices into a device batch.

The engine never iterates a DataLoader. It draws the order of an epoch from (seed, epoch) alone, cuts it into
windows of `batch_size * accumulate` indices and asks the dataset for each micro-batch by index. Because the data
position is an index into that order, a resumed run continues from the next window without reading anything it skips.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat
from typing import Protocol

import numpy as np
import torch

from trainflow.engine.augment import Augment, apply

IGNORE_INDEX = -100  # targets with this value (padding positions of per-token targets) carry no loss


@dataclass
class Batch:
    """One micro-batch on the training device.

    inputs: keyword arguments of the model's forward (`x` for tables; `tokens` and `mask` for text, or packed text's
    `tokens`, `documents`, `positions` and `lengths`: TextData.pack; `images`).
    count: the number of loss terms in it (samples, or real target tokens), known on the host without a device sync.
    lengths: packed text: each sequence's tokens, on the host (what its FLOPs are counted from).
    """

    inputs: dict[str, torch.Tensor]
    target: torch.Tensor
    count: int
    lengths: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.target)


class Dataset(Protocol):
    index_device: torch.device  # where batch() wants its index tensor

    def __len__(self) -> int: ...
    def batch(self, idx: torch.Tensor) -> Batch: ...
    def count(self, idx: torch.Tensor) -> int: ...  # loss terms of these samples, read on the host
    def tokens(self, idx: torch.Tensor) -> int: ...  # real input tokens of these samples (0 without text), on the host
    def subset(self, idx: torch.Tensor) -> Dataset: ...


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Sample order for one epoch: a function of (seed, epoch) only, never of batch size or accumulation."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


BLOCK = 64  # train.shuffle blocks: rows read together (one `pread` for a table read from disk)
MIX = 16  # ... and blocks whose rows are mixed: a micro-batch smaller than BLOCK * MIX still draws on MIX blocks
_GROUPS = 1024  # groups of MIX blocks mixed per step (bounded temporaries, a few MiB)


def block_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """train.shuffle blocks: the rows cut into blocks of BLOCK consecutive rows (the last one shorter), the blocks in a
    random order (randperm), then the rows of each MIX consecutive blocks of that order in a random order among
    themselves. A window of the order is then a few runs of consecutive rows, read with one `pread` each
    (RowFile.take), where a permutation of the rows needs one per row. Like epoch_order, a function of (n, seed, epoch)
    only: the same for any batch size, accumulation or world size."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    blocks = torch.randperm(-(-n // BLOCK), generator=g)
    order = torch.empty(n, dtype=torch.int64)
    lo = 0
    for first in range(0, len(blocks), MIX * _GROUPS):
        some = blocks[first : first + MIX * _GROUPS]
        rows = (some[:, None] * BLOCK + torch.arange(BLOCK)).flatten()
        group = (torch.arange(len(some)) // MIX).repeat_interleave(BLOCK).double()
        if n % BLOCK:  # the last block is short
            group, rows = group[rows < n], rows[rows < n]
        # within a group, the order of uniform draws: the group plus a draw in [0, 1) sorts groups apart
        mixed = torch.argsort(group + torch.rand(len(rows), generator=g, dtype=torch.float64), stable=True)
        order[lo : lo + len(rows)] = rows[mixed]
        lo += len(rows)
    return order


SHUFFLES = {"rows": epoch_order, "blocks": block_order}


ONE_ROW, LONGEST = 0, -1  # TextData.pack's widths: one row of every sequence; rows as wide as the longest one
BUCKET = 1024  # text: samples sorted by length together (a fixed count, so the order never depends on batch size)


class TensorData:
    """A table: features `x` [N, F] and targets `y` [N], moved to the device once; a batch is an index gather."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, device: torch.device | str = "cpu") -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        self.device = self.index_device = torch.device(device)
        self.x = x.to(self.device)
        self.y = y.to(self.device)
        self.shuffle = "rows"  # train.shuffle: the epoch order's kind (SHUFFLES)

    def __len__(self) -> int:
        return len(self.y)

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        return SHUFFLES[self.shuffle](len(self), seed, epoch)

    def batch(self, idx: torch.Tensor) -> Batch:
        return Batch({"x": self.x[idx]}, self.y[idx], count=len(idx))

    def count(self, idx: torch.Tensor) -> int:
        return len(idx)

    def tokens(self, idx: torch.Tensor) -> int:
        return 0

    def to(self, device: torch.device) -> None:
        self.device = self.index_device = device
        self.x, self.y = self.x.to(device), self.y.to(device)

    def subset(self, idx: torch.Tensor) -> TensorData:
        return TensorData(self.x[idx.to(self.device)], self.y[idx.to(self.device)], self.device)


class RowFile:
    """The rows of a C-ordered array: read from its file by `pread` when it is memory-mapped (np.load with
    mmap_mode="r"), else indexed in memory. A read copies just the rows asked for, so the process holds no more than
    the batch: gathering through the memory map itself would map every page it touches into the process (on kernels
    whose page cache keeps large folios, 2 MiB around each random row), and its RSS would grow to the whole file."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape, self.dtype, self.stride = array.shape[1:], array.dtype, array.strides[0]
        self.fd: int | None = None
        self.filename = str(getattr(array, "filename", None))
        mapped = getattr(array, "_mmap", None)
        if isinstance(array, np.memmap) and isinstance(mapped, mmap.mmap) and array.flags.c_contiguous and len(array):
            # where the first row lies in the file: np.memmap maps from `offset` rounded down to the allocation
            # granularity, and the array may start further in (a view)
            mapped_from = array.offset - array.offset % mmap.ALLOCATIONGRANULARITY
            base = np.frombuffer(mapped, np.uint8).ctypes.data
            self.start = mapped_from + array.ctypes.data - base
            self.fd = os.open(self.filename, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.array)

    def take(self, i: np.ndarray) -> np.ndarray:
        """Rows `i` (in that order), a new writable array."""
        if self.fd is None:
            return np.asarray(self.array[i])  # fancy indexing copies
        n, stride = len(i), self.stride
        if n == 0:
            return np.empty((0, *self.shape), self.dtype)
        # One read per run of consecutive rows (train.shuffle blocks makes runs of BLOCK; a full permutation, few).
        order = np.argsort(i, kind="stable")
        ordered = np.asarray(i)[order]
        cut = np.flatnonzero(np.diff(ordered) != 1) + 1
        first = ordered[np.concatenate([[0], cut])]
        count = np.diff(np.concatenate([[0], cut, [n]]))
        offsets = (self.start + first * stride).tolist()
        raw = b"".join(map(os.pread, repeat(self.fd), (count * stride).tolist(), offsets))
        if len(raw) != stride * n:
            raise ValueError(f"{self.filename} is shorter than its header says: was it truncated?")
        rows = np.empty((n, *self.shape), self.dtype)
        rows[order] = np.frombuffer(raw, self.dtype).reshape(n, *self.shape)
        return rows

    def __del__(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


class BlockCache:
    """Reads for train.shuffle blocks: the whole blocks (BLOCK consecutive rows) a batch's rows lie in, each run of
    blocks with one `pread`, kept for the next micro-batches (the last 2 * MIX blocks read). The rows of one group of
    MIX blocks are spread over the micro-batches of its BLOCK * MIX positions, so a micro-batch smaller than that
    still costs about a read per block, not a read per row. Thread-safe (the next batch is read in the background
    while the trainer may ask for another on the spot)."""

    def __init__(self, rows: RowFile, keep: int = 2 * MIX) -> None:
        self.rows, self.keep = rows, keep
        self.blocks: OrderedDict[int, np.ndarray] = OrderedDict()
        self.lock = threading.Lock()

    def take(self, i: np.ndarray) -> np.ndarray:
        """Rows `i` (in that order), a new writable array: RowFile.take's."""
        if len(i) == 0:
            return self.rows.take(np.asarray(i))
        block = np.asarray(i) // BLOCK
        with self.lock:
            wanted = np.unique(block)
            missing = [b for b in wanted.tolist() if b not in self.blocks]
            if missing:
                first = np.asarray(missing, dtype=np.int64)[:, None] * BLOCK
                rows = (first + np.arange(BLOCK)).ravel()
                read = self.rows.take(rows[rows < len(self.rows)])
                lo = 0
                for b in missing:
                    size = min(BLOCK, len(self.rows) - b * BLOCK)
                    self.blocks[b] = read[lo : lo + size]
                    lo += size
            held = [self.blocks[b] for b in wanted.tolist()]
            for b in wanted.tolist():
                self.blocks.move_to_end(b)
            while len(self.blocks) > max(self.keep, len(wanted)):
                self.blocks.popitem(last=False)
        start = np.concatenate([[0], np.cumsum([len(h) for h in held])])[:-1]
        return np.concatenate(held)[start[np.searchsorted(wanted, block)] + np.asarray(i) % BLOCK]


class RecordFile:
    """Records of any length stored back to back in one file (images' encoded bytes), record i at bytes
    offsets[i]:offsets[i + 1]; read by `pread`, one call per record, so the process holds just the records asked
    for (as RowFile)."""

    def __init__(self, path: os.PathLike[str] | str, offsets: np.ndarray) -> None:
        self.path, self.offsets = str(path), offsets
        self.fd = os.open(self.path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def read(self, rows: Sequence[int]) -> list[bytes]:
        """Records `rows`, in that order."""
        out = []
        for i in rows:
            start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
            data = os.pread(self.fd, stop - start, start)
            if len(data) != stop - start:
                raise ValueError(f"{self.path} is shorter than its offsets say: was it truncated?")
            out.append(data)
        return out

    def __del__(self) -> None:
        if getattr(self, "fd", None) is not None:
            os.close(self.fd)


class Lookahead:
    """Makes the next batch in a background thread while the model trains on this one. The next batch is predicted as
    the window that follows this one in the epoch's order (`order`), or in index order (evaluation, or before an
    order is set); when the caller asks for another (a rank's shard), the batch is made on the spot. Either way the
    batch is `make(idx, epoch)`, so what comes out never depends on whether the prediction was right."""

    def __init__(
        self, n: int, make: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]], name: str
    ) -> None:
        self.n, self.make, self.name = n, make, name
        self._order: torch.Tensor | None = None  # this epoch's order (None: index order)
        self._position: torch.Tensor | None = None  # sample index -> its position in _order
        self._next: tuple[torch.Tensor, int, Future[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def order(self, order: torch.Tensor) -> None:
        """The epoch's order, which the following windows are predicted from."""
        self._order = order
        small = torch.int32 if len(order) < 2**31 else torch.int64  # 4 bytes a sample where that holds every position
        self._position = torch.empty(len(order), dtype=small)
        self._position[order] = torch.arange(len(order), dtype=small)
        self._next = None

    def get(self, idx: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """make(idx, epoch), made ahead when it was predicted; then the one after it is started."""
        ready, self._next = self._next, None
        if ready is not None and ready[1] == epoch and torch.equal(ready[0], idx):
            made = ready[2].result()
        else:
            made = self.make(idx, epoch)
        following = self._following(idx)
        if following is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"trainflow-{self.name}")
            self._next = (following, epoch, self._pool.submit(self.make, following, epoch))
        return made

    def _following(self, idx: torch.Tensor) -> torch.Tensor | None:
        """The window after `idx` when `idx` is a run of consecutive positions of the order; else None."""
        n = self.n
        if len(idx) == 0:
            return None
        if self._order is None or self._position is None:
            start = int(idx[0])
            if not torch.equal(idx, torch.arange(start, start + len(idx))) or start + len(idx) >= n:
                return None
            return torch.arange(start + len(idx), min(start + 2 * len(idx), n))
        start = int(self._position[idx[0]])
        stop = start + len(idx)
        if stop >= n or not torch.equal(self._order[start:stop], idx):
            return None
        return self._order[stop : stop + len(idx)]


class MemmapData:
    """A table larger than the memory budget: `x` [N, F] float32 and `y` [N] in .npy files on the host (np.load with
    mmap_mode="r"; trainflow.data.stream writes them). A batch is the rows `idx` of x read from its file (`RowFile`:
    a `pread` per run of consecutive rows, never more than the batch held) and their targets (held in memory: 4 or 8
    bytes a row), copied to the device: the same rows in the same order as TensorData gathers, so the same updates
    bit for bit. A background thread reads the next batch while this one trains (`Lookahead`). The sample order is a
    function of (seed, epoch) as the engine's (`shuffle`: rows, a permutation of the rows, or blocks, `block_order`),
    so exact accumulation and resume across world sizes hold unchanged. With rows the price is a random read per
    sample (bench/random_access.py); with blocks, a read per 64 rows (`BlockCache`, for any micro-batch size)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, device: torch.device | str = "cpu") -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        # The targets are read into memory (a few bytes a row, as the split's assignment): a second read per sample
        # would halve the rate at which rows come off the disk.
        self.x, self.y = RowFile(x), np.array(y)
        self.device = torch.device(device)
        self.index_device = torch.device("cpu")  # the rows are read on the host
        self.ahead = Lookahead(len(y), lambda idx, _: self._rows(idx), "rows")
        self.shuffle = "rows"  # train.shuffle; blocks reads whole blocks of 64 rows (BlockCache), rows a row a read
        self.blocks = BlockCache(self.x)

    def __len__(self) -> int:
        return len(self.y)

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """The epoch's order (SHUFFLES[shuffle]), which the next batch is predicted from."""
        order = SHUFFLES[self.shuffle](len(self), seed, epoch)
        self.ahead.order(order)
        return order

    def _rows(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i = idx.numpy()
        x = self.blocks.take(i) if self.shuffle == "blocks" else self.x.take(i)
        return torch.from_numpy(x), torch.from_numpy(self.y[i])

    def batch(self, idx: torch.Tensor) -> Batch:
        x, y = self.ahead.get(idx.cpu(), 0)
        return Batch({"x": _to(x, self.device)}, _to(y, self.device), count=len(idx))

    def count(self, idx: torch.Tensor) -> int:
        return len(idx)

    def tokens(self, idx: torch.Tensor) -> int:
        return 0

    def to(self, device: torch.device) -> None:
        self.device = device  # the data stays where it is; batches are copied there

    def subset(self, idx: torch.Tensor) -> TensorData:
        x, y = self._rows(idx.cpu())  # a subset (overfit_batches, a probe) is small: held in memory
        return TensorData(x, y, self.device)


class TextData:
    """Variable-length token sequences, padded per micro-batch to that batch's longest sequence.

    targets: one per sequence (a LongTensor/FloatTensor [N]: classification or regression of the text) or one per
    token (a list of 1-d tensors as long as each sequence; IGNORE_INDEX marks positions without a label). The loss of
    an update is normalised by the real samples or real target tokens of its whole window.
    """

    def __init__(
        self,
        sequences: list[torch.Tensor],
        targets: torch.Tensor | list[torch.Tensor],
        *,
        pad_id: int = 0,
        bucket: int = BUCKET,
        device: torch.device | str = "cpu",
    ) -> None:
        if len(sequences) != len(targets):
            raise ValueError(f"{len(sequences)} sequences but {len(targets)} targets")
        if any(len(s) == 0 for s in sequences):
            raise ValueError("every sequence needs at least one token")
        self.sequences = [s.long() for s in sequences]
        self.lengths = torch.tensor([len(s) for s in sequences])
        self.per_token = isinstance(targets, list)
        if isinstance(targets, list):
            for i, (s, t) in enumerate(zip(sequences, targets)):
                if len(s) != len(t):
                    raise ValueError(f"sequence {i} has {len(s)} tokens but {len(t)} targets")
            self.token_targets = [t.long() for t in targets]
            self.flat_targets = torch.cat(self.token_targets)
            self.label_counts = torch.tensor([int((t != IGNORE_INDEX).sum()) for t in self.token_targets])
        else:
            self.targets = targets
        self.flat = torch.cat(self.sequences)
        self.offsets = torch.cumsum(self.lengths, 0) - self.lengths
        # each token's position in its own sequence (pack's `positions`)
        self.positions = torch.arange(len(self.flat)) - torch.repeat_interleave(self.offsets, self.lengths)
        self.pad_id = pad_id
        self.bucket = bucket
        self.device = torch.device(device)
        self.index_device = torch.device("cpu")  # padding happens on the host, then one pinned copy per tensor
        # train.packing: None pads each micro-batch; ONE_ROW packs it into one row, LONGEST into rows as wide as its
        # longest sequence, a positive width into rows that wide (pack).
        self.pack_width: int | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """Length bucketing: the epoch's random order, then each run of `bucket` samples sorted by length.

        Neighbouring samples then have similar lengths, so per-batch padding shrinks, while the order is still a
        function of (seed, epoch) only — restorable for resume, and independent of batch size and accumulation.
        """
        order = epoch_order(len(self), seed, epoch)
        if self.bucket <= 1:
            return order
        lengths = self.lengths[order]
        parts = []
        for start in range(0, len(order), self.bucket):
            chunk = slice(start, start + self.bucket)
            parts.append(order[chunk][torch.argsort(lengths[chunk], descending=True, stable=True)])
        return torch.cat(parts)

    def _pad(self, flat: torch.Tensor, idx: torch.Tensor, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = self.lengths[idx]
        width = int(lengths.max()) if len(idx) else 1  # an empty micro-batch (a rank with no samples left) too
        pos = torch.arange(width)
        mask = pos[None, :] < lengths[:, None]
        src = (self.offsets[idx][:, None] + pos[None, :]).clamp_(max=len(flat) - 1)
        return torch.where(mask, flat[src], torch.full((), fill, dtype=flat.dtype)), mask

    def pack(self, idx: torch.Tensor, width: int) -> Batch:
        """The sequences `idx` packed back to back: rows of `width` tokens (ONE_ROW: one row of them all; LONGEST: as
        wide as the longest of them), each sequence whole in one row, placed first-fit longest first (a micro-batch
        is already nearly sorted by length, see epoch_order). The model's inputs: `tokens` [R, W] (pad_id after each
        row's last sequence), `documents` [R, W] (each token's sequence: its index in `idx`; -1 where a row is
        padded), `positions` [R, W] (from 0 at each sequence's first token) and `lengths` [N]. Per-token targets are
        packed the same way (IGNORE_INDEX between), so the loss adds up the same terms as the padded batch's."""
        idx = idx.cpu()
        lengths = self.lengths[idx]
        n = len(idx)
        total = int(lengths.sum())
        # Each token's place in self.flat, its sequence (in idx) and its position in it: one pass over the tokens.
        starts = torch.cumsum(lengths, 0) - lengths  # each sequence's first token in the packed order
        src = torch.repeat_interleave(self.offsets[idx] - starts, lengths, output_size=total) + torch.arange(total)
        doc = torch.repeat_interleave(torch.arange(n), lengths, output_size=total)
        within = self.positions[src]
        values = {"tokens": (self.flat[src], self.pad_id), "documents": (doc, -1), "positions": (within, 0)}
        if self.per_token:
            values["target"] = (self.flat_targets[src], IGNORE_INDEX)
        if width == LONGEST:
            width = int(lengths.max()) if n else 1
        if width == ONE_ROW or n == 0:  # the sequences in idx's order, back to back: nothing to place
            packed = {
                k: (v if n else torch.full((1,), fill, dtype=v.dtype)).view(1, -1) for k, (v, fill) in values.items()
            }
        else:
            if int(lengths.max()) > width:
                raise ValueError(f"a sequence of {int(lengths.max())} tokens does not fit a packed row of {width}")
            used: list[int] = []  # tokens in each row so far
            row_of, start_of = [0] * n, [0] * n
            for i in torch.argsort(lengths, descending=True, stable=True).tolist():
                length = int(lengths[i])
                k = next((k for k, u in enumerate(used) if u + length <= width), len(used))
                if k == len(used):
                    used.append(0)
                row_of[i], start_of[i] = k, used[k]
                used[k] += length
            r, c = torch.tensor(row_of)[doc], torch.tensor(start_of)[doc] + within
            packed = {}
            for key, (v, fill) in values.items():
                packed[key] = torch.full((len(used), width), fill, dtype=v.dtype)
                packed[key][r, c] = v
        target = packed.pop("target") if self.per_token else self.targets[idx]
        count = int(self.label_counts[idx].sum()) if self.per_token else n
        inputs = {**packed, "lengths": lengths}
        return Batch({k: _to(v, self.device) for k, v in inputs.items()}, _to(target, self.device), count, lengths)

    def batch(self, idx: torch.Tensor) -> Batch:
        if self.pack_width is not None:
            return self.pack(idx, self.pack_width)
        idx = idx.cpu()
        tokens, mask = self._pad(self.flat, idx, self.pad_id)
        if self.per_token:
            target, _ = self._pad(self.flat_targets, idx, IGNORE_INDEX)
            count = int(self.label_counts[idx].sum())
        else:
            target, count = self.targets[idx], len(idx)
        return Batch(
            {"tokens": _to(tokens, self.device), "mask": _to(mask, self.device)},
            _to(target, self.device),
            count=count,
        )

    def count(self, idx: torch.Tensor) -> int:
        return int(self.label_counts[idx.cpu()].sum()) if self.per_token else len(idx)

    def tokens(self, idx: torch.Tensor) -> int:
        return int(self.lengths[idx.cpu()].sum())

    def to(self, device: torch.device) -> None:
        self.device = device  # where batches go; the sequences stay on the host for padding

    def subset(self, idx: torch.Tensor) -> TextData:
        keep = idx.cpu().tolist()
        targets: torch.Tensor | list[torch.Tensor] = (
            [self.token_targets[i] for i in keep] if self.per_token else self.targets[idx.cpu()]
        )
        data = TextData(
            [self.sequences[i] for i in keep], targets, pad_id=self.pad_id, bucket=self.bucket, device=self.device
        )
        data.pack_width = self.pack_width
        return data


class ImageData:
    """Images as normalised float [n, C, H, W] batches (`images`), augmented when `augment` is set (the train split).

    `images` is either every image decoded, a uint8 tensor [N, C, H, W] (small data: decoded once; it moves to the
    training device and a batch is an index gather there), or `decode(indices) -> uint8 [n, C, H, W]` (data too big
    to hold decoded): then a background thread prepares the next batch while the model trains on this one
    (`Lookahead`). Either way a batch is a function of (seed, epoch, indices) only: augmentation draws from
    `augment.uniforms`, never from a generator.

    The trainer asks for each epoch's order (`epoch_order`) before any of its batches, also when it resumes inside
    an epoch: that call tells the dataset the (seed, epoch) that its augmentation draws from.
    """

    def __init__(
        self,
        images: torch.Tensor | Callable[[list[int]], torch.Tensor],
        targets: torch.Tensor,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        augment: Augment | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if isinstance(images, torch.Tensor) and (len(images) != len(targets) or images.dim() != 4):
            raise ValueError(f"images {tuple(images.shape)} must be [N, C, H, W] with N = {len(targets)} targets")
        self.images = images
        self.targets = targets
        self.mean, self.std = list(mean), list(std)
        # mean/std [1, C, 1, 1] where batches are normalised: on the host (decoded from files: the prefetch thread
        # normalises them there) and on the device (decoded tensors). Never copied per batch: a device-to-host copy
        # would wait for the training queued on the device.
        self._host_scale = tuple(
            torch.tensor(v, dtype=torch.float32)[None, :, None, None] for v in (self.mean, self.std)
        )
        self._scale = self._host_scale
        self.augment = augment
        self.device = torch.device(device)
        self.decoded = isinstance(images, torch.Tensor)
        self.index_device = self.device if self.decoded else torch.device("cpu")
        self.seed, self.epoch = 0, 0
        self.ahead = Lookahead(len(targets), self._make, "images")

    def __len__(self) -> int:
        return len(self.targets)

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """epoch_order(n, seed, epoch), and the (seed, epoch) this epoch's augmentation draws from."""
        order = epoch_order(len(self), seed, epoch)
        self.seed, self.epoch = seed, epoch
        if not self.decoded:
            self.ahead.order(order)
        return order

    def batch(self, idx: torch.Tensor) -> Batch:
        if self.decoded:
            images, target = self._make(idx, self.epoch)
        else:
            images, target = self.ahead.get(idx.cpu(), self.epoch)
            images, target = _to(images, self.device), _to(target, self.device)
        return Batch({"images": images}, target, count=len(idx))

    def _make(self, idx: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of samples `idx`: gathered or decoded, augmented, normalised (float32)."""
        pixels = self.images[idx] if isinstance(self.images, torch.Tensor) else self.images(idx.tolist())
        x = pixels.float()
        if self.augment is not None:
            x = apply(x, idx, self.seed, epoch, self.augment)
        mean, std = self._scale if self._scale[0].device == x.device else self._host_scale
        return (x - mean) / std, self.targets[idx.to(self.targets.device)]

    def count(self, idx: torch.Tensor) -> int:
        return len(idx)

    def tokens(self, idx: torch.Tensor) -> int:
        return 0

    def to(self, device: torch.device) -> None:
        self.device = torch.device(device)
        if isinstance(self.images, torch.Tensor):
            self.images = self.images.to(self.device)
            self.targets = self.targets.to(self.device)
            self.index_device = self.device
        self._scale = tuple(t.to(self.device) for t in self._scale)

    def subset(self, idx: torch.Tensor) -> ImageData:
        keep = idx.to(self.index_device)
        images: torch.Tensor | Callable[[list[int]], torch.Tensor]
        if isinstance(self.images, torch.Tensor):
            images = self.images[keep]
        else:
            decode, rows = self.images, keep.cpu()
            images = lambda i: decode(rows[i].tolist())  # noqa: E731
        targets = self.targets[keep.to(self.targets.device)]
        return ImageData(images, targets, self.mean, self.std, augment=self.augment, device=self.device)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without stalling the host: pinned memory and a non-blocking copy on CUDA."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
