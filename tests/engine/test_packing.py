"""train.packing: a micro-batch's sequences packed back to back (TextData.pack) instead of padded.

The layout is checked by reading the sequences back out of it by hand; each model's packed outputs against the same
model run on every sequence alone, unpadded (a batch of one); training against plain PyTorch on padded windows."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from engine_kit import (
    Interrupted,
    bitwise_equal,
    crash_after,
    make_trainer,
    reference,
    rel,
    table,
    text_data,
    text_model,
    training_state,
)
from torch import nn
from torch.nn import functional as F

from trainflow import cli
from trainflow.core.errors import ParamsError
from trainflow.core.paths import Paths
from trainflow.engine import flops
from trainflow.engine.loaders import IGNORE_INDEX, LONGEST, ONE_ROW, TextData
from trainflow.engine.trainer import Trainer
from trainflow.models import MLP
from trainflow.models.text import TextBag, TextTransformer
from trainflow.params import load_params
from trainflow.stages import run_stage
from trainflow.stages.train import packing_width

WIDTHS = [ONE_ROW, LONGEST, 24]


def sequences(n: int = 40, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 50, (int(k),), generator=g) for k in torch.randint(1, 23, (n,), generator=g)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("per_token", [False, True])
def test_the_layout_holds_every_sequence_whole_and_nothing_else(width: int, per_token: bool) -> None:
    seqs = sequences()
    targets: torch.Tensor | list[torch.Tensor] = (
        [s * 10 for s in seqs] if per_token else torch.arange(len(seqs))  # a target names its token or sequence
    )
    data = TextData(seqs, targets, pad_id=0)
    idx = torch.tensor([5, 3, 17, 0, 31, 8, 22, 11, 39, 2])
    b = data.pack(idx, width)
    tokens, documents, positions = (b.inputs[k] for k in ("tokens", "documents", "positions"))
    rows, cols = tokens.shape
    assert cols == {ONE_ROW: sum(len(seqs[i]) for i in idx), LONGEST: max(len(seqs[i]) for i in idx)}.get(width, width)
    for j, i in enumerate(idx.tolist()):
        where = (documents == j).nonzero().tolist()
        assert len({r for r, _ in where}) == 1, "a sequence is split across rows"
        row, first = where[0]
        assert [c for _, c in where] == list(range(first, first + len(seqs[i])))
        assert tokens[row, first : first + len(seqs[i])].tolist() == seqs[i].tolist()
        assert positions[row, first : first + len(seqs[i])].tolist() == list(range(len(seqs[i])))
        if per_token:
            assert b.target[row, first : first + len(seqs[i])].tolist() == (seqs[i] * 10).tolist()
    padding = documents == -1
    assert int((~padding).sum()) == sum(len(seqs[i]) for i in idx) == int(b.lengths.sum())  # type: ignore[union-attr]
    assert (tokens[padding] == 0).all() and (positions[padding] == 0).all()
    if per_token:
        assert (b.target[padding] == IGNORE_INDEX).all()
    else:
        assert b.target.tolist() == idx.tolist()
    assert b.count == (sum(len(seqs[i]) for i in idx) if per_token else len(idx))
    if width == 24:  # first-fit longest first: no row could have taken a sequence placed in a later row
        used = [int((documents[r] >= 0).sum()) for r in range(rows)]
        assert all(u <= 24 for u in used) and rows == len(used)
        assert rows <= -(-2 * sum(used) // 24)  # no more than twice the rows a perfect packing needs


def test_a_sequence_longer_than_the_row_is_refused() -> None:
    data = TextData(sequences(), torch.zeros(40), pad_id=0)
    with pytest.raises(ValueError, match="does not fit a packed row of 4"):
        data.pack(torch.arange(10), 4)


def models() -> list[tuple[str, nn.Module, int]]:
    torch.manual_seed(0)
    make = {"d_model": 16, "n_heads": 2, "n_layers": 2, "max_len": 32, "dropout": 0.1}
    pairs = TextBag(50, 3, d_model=8, buckets=13)
    with torch.no_grad():
        pairs.emb.weight[50:].normal_()  # pairs start out at zero: here they count
    return [
        ("bag", TextBag(50, 3, d_model=8), ONE_ROW),
        ("bag pairs", pairs, ONE_ROW),
        ("transformer", TextTransformer(50, 3, **make), LONGEST),  # type: ignore[arg-type]
        ("transformer rows", TextTransformer(50, 3, **make), 32),  # type: ignore[arg-type]
        ("transformer tokens", TextTransformer(50, 3, head="token", **make), 32),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(("name", "model", "width"), models(), ids=[m[0] for m in models()])
def test_packed_outputs_are_each_sequence_run_alone(name: str, model: nn.Module, width: int) -> None:
    model.eval()
    seqs = sequences()
    data = TextData(seqs, torch.zeros(len(seqs)), pad_id=0)
    idx = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(1))[:16]
    b = data.pack(idx, width)
    with torch.no_grad():
        out = model(**b.inputs)
        padded = model(**data.batch(idx).inputs)
        for j, i in enumerate(idx.tolist()):
            alone = model(seqs[i][None], torch.ones(1, len(seqs[i]), dtype=torch.bool))[0]
            if name.endswith("tokens"):  # one output per token, where the packed row holds it
                got = out[b.inputs["documents"] == j]
                torch.testing.assert_close(got, alone, rtol=0, atol=1e-5)
            else:
                torch.testing.assert_close(out[j], alone, rtol=0, atol=1e-5)
                torch.testing.assert_close(out[j], padded[j], rtol=0, atol=1e-5)


def test_attention_stays_within_a_sequence() -> None:
    """Change one sequence's tokens: the others' outputs do not move (the mask keeps them apart in a shared row)."""
    model = models()[3][1].eval()
    seqs = sequences()
    idx = torch.arange(12)
    before = model(**TextData(seqs, torch.zeros(40)).pack(idx, 32).inputs)
    seqs[4] = (seqs[4] + 7) % 50
    after = model(**TextData(seqs, torch.zeros(40)).pack(idx, 32).inputs)
    assert not torch.allclose(before[4], after[4])
    others = [j for j in range(12) if j != 4]
    torch.testing.assert_close(before[others], after[others], rtol=0, atol=1e-6)


@pytest.mark.parametrize("head", ["token", "sequence"])
def test_packed_training_is_plain_pytorch_on_padded_windows(tmp_path: Path, head: str) -> None:
    """The engine on packed micro-batches (accumulate 4: the window's loss normalised by all its terms) against the
    plain loop of engine_kit on whole padded windows: the same weights. Dropout 0: masks are drawn per layout."""
    data = text_data(per_token=head == "token")  # 45 sequences in windows of 8: the last window holds 5
    data.pack_width = 24
    packed = make_trainer(tmp_path / "a", text_model(head), batch_size=2, accumulate=4, epochs=4, lr=1e-3)
    packed.fit(data, data)

    padded = text_data(per_token=head == "token")  # the same sequences, padded

    def mean_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
        b = padded.batch(idx)
        out = model(**b.inputs)
        return F.cross_entropy(out.reshape(-1, 4), b.target.reshape(-1), ignore_index=IGNORE_INDEX)

    ref = reference(text_model(head), len(data), mean_loss, packed.p, orders=data.epoch_order)
    assert rel(packed.model, ref) <= 1e-5
    assert rel(text_model(head), ref) > 1e-3  # it did train (a hundred times the match's tolerance)


def packed_run(tmp: Path, stop_after: int | None = None) -> Trainer:
    """Packed per-token text with dropout (only a restored random stream continues it), checkpoints every 4 updates;
    with stop_after, a crash after that many updates."""
    torch.manual_seed(2)
    model = TextTransformer(vocab_size=30, out_features=4, d_model=16, n_heads=2, n_layers=1, dropout=0.2, head="token")
    t = make_trainer(tmp, model, batch_size=2, accumulate=4, epochs=3, lr=1e-3, checkpoint_every=4, resume="auto")
    if stop_after is not None:
        crash_after(t, stop_after)
    data = text_data()
    data.pack_width = 24
    with contextlib.suppress(Interrupted):
        t.fit(data, text_data())
    return t


def test_a_packed_run_resumed_after_a_crash_continues_bit_for_bit(tmp_path: Path) -> None:
    whole = packed_run(tmp_path / "whole")
    crashed = packed_run(tmp_path / "resumed", stop_after=10)
    resumed = packed_run(tmp_path / "resumed")
    assert resumed.resumed_from == 8 and resumed.state.updates == whole.state.updates == 18
    assert bitwise_equal(training_state(resumed), training_state(whole)) == []
    assert resumed.state.history == whole.state.history
    assert bitwise_equal(training_state(crashed), training_state(whole))  # the crash did cut it short


def test_flops_count_each_sequence_at_its_own_length() -> None:
    model = TextTransformer(50, 3, d_model=16, n_heads=2, n_layers=2, max_len=32)
    data = TextData(sequences(), torch.zeros(40))
    idx = torch.arange(9)
    count = flops.flops_per_batch(model)
    assert count is not None
    by_hand = sum(model.flops_per_token(len(s)) * len(s) for s in sequences()[:9])
    assert count(data.pack(idx, 32)) == pytest.approx(by_hand, rel=1e-12)
    widest = max(len(s) for s in sequences()[:9])
    assert count(data.batch(idx)) == pytest.approx(9 * model.flops_per_token(widest) * widest, rel=1e-12)


def test_packing_is_refused_where_it_cannot_pack() -> None:
    with pytest.raises(ParamsError, match=r"train\.packing.*no text column"):
        packing_width(MLP(6, 3, [4], dropout=0.0), table())
    with pytest.raises(ParamsError, match=r"train\.packing.*MLP takes padded batches only"):
        packing_width(MLP(6, 3, [4], dropout=0.0), TextData(sequences(), torch.zeros(40)))
    assert packing_width(TextBag(50, 3), TextData(sequences(), torch.zeros(40))) == ONE_ROW
    assert packing_width(models()[2][1], TextData(sequences(), torch.zeros(40))) == LONGEST


def test_packing_a_table_is_refused_through_the_train_stage_and_the_fix_works(
    iris_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trainflow stage train -S train.packing=true` on a table: exit 2, the line names train.packing and says to set it
    to false, nothing trained and params.yaml as it was; following it (`-S train.packing=false`) trains."""
    paths = Paths(iris_project)
    for stage in ("ingest", "split"):
        run_stage(stage, load_params(paths.params), paths)
    monkeypatch.chdir(iris_project)
    params = paths.params.read_bytes()
    assert cli.main(["stage", "train", "-S", "train.packing=true"]) == 2
    err = capsys.readouterr().err
    assert "  train.packing: packs token sequences; this data has no text column: set it to false\n" in err, err
    assert paths.params.read_bytes() == params and not paths.final.exists()
    assert cli.main(["stage", "train", "-S", "train.packing=false", "-S", "train.epochs=2"]) == 0
    assert (paths.final / "model.json").is_file()
