"""The model zoo's entry (trainflow.models): the MLP's layers and output, model.name resolved to a built-in or
a user's torch.nn.Module (every refusal in full), build_model handing the data sizes only to constructors that take
them, and the source files (and their hash) recorded for a user's model."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainflow.core.errors import UserError


def test_the_mlp_is_linear_gelu_dropout_per_hidden_layer_then_a_head() -> None:
    from trainflow.models import MLP

    model = MLP(5, 3, [7, 4], 0.25)
    layers = list(model.net)
    assert [type(m) for m in layers] == [nn.Linear, nn.GELU, nn.Dropout, nn.Linear, nn.GELU, nn.Dropout, nn.Linear]
    shapes = [(m.in_features, m.out_features) for m in layers if isinstance(m, nn.Linear)]
    assert shapes == [(5, 7), (7, 4), (4, 3)]
    assert [m.p for m in layers if isinstance(m, nn.Dropout)] == [0.25, 0.25]
    x = torch.randn(2, 5)
    model.eval()
    l1, l2, l3 = (m for m in layers if isinstance(m, nn.Linear))
    expected = l3(F.gelu(l2(F.gelu(l1(x)))))
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    bare = MLP(3, 2, [], 0.0)
    assert [type(m) for m in bare.net] == [nn.Linear] and (bare.net[0].in_features, bare.net[0].out_features) == (3, 2)


def test_model_class_names_the_built_in_models() -> None:
    from trainflow.models import MLP, model_class
    from trainflow.models.cnn import CNN
    from trainflow.models.hf import HFSequenceModel
    from trainflow.models.text import TextTransformer

    assert model_class("mlp") is MLP
    assert model_class("text_transformer") is TextTransformer
    assert model_class("cnn") is CNN
    assert model_class("hf") is HFSequenceModel
    assert model_class("torch.nn:Linear") is nn.Linear


def test_model_class_refusals_in_full() -> None:
    from trainflow.models import model_class

    with pytest.raises(UserError) as missing:
        model_class("nosuchpackage_xyz.models:Net")
    assert str(missing.value) == (
        "model.name 'nosuchpackage_xyz.models:Net': cannot import it (No module named 'nosuchpackage_xyz'); is the "
        "package installed?"
    )
    assert missing.value.__cause__ is None and missing.value.__suppress_context__
    with pytest.raises(UserError) as no_attr:
        model_class("torch.nn:Nope")
    assert str(no_attr.value) == (
        "model.name 'torch.nn:Nope': cannot import it (module 'torch.nn' has no attribute 'Nope'); is the package "
        "installed?"
    )
    with pytest.raises(UserError) as not_module:
        model_class("collections:OrderedDict")
    assert str(not_module.value) == "model.name 'collections:OrderedDict' is not a torch.nn.Module subclass"
    with pytest.raises(UserError) as not_class:
        model_class("math:pi")
    assert str(not_class.value) == "model.name 'math:pi' is not a torch.nn.Module subclass"


def test_build_model_passes_the_data_sizes_only_to_constructors_that_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.models import MLP, build_model

    config = {"name": "mlp", "in_features": 3, "out_features": 2, "hidden_sizes": [4], "dropout": 0.0,
              "vocab_size": 99, "pad_id": 0, "in_channels": 3, "image_size": [8, 8]}  # fmt: skip
    model = build_model(config)
    assert type(model) is MLP and config["name"] == "mlp"  # the config is left as it was
    assert [(m.in_features, m.out_features) for m in model.net if isinstance(m, nn.Linear)] == [(3, 4), (4, 2)]
    pkg = tmp_path / "usermods_exact"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from torch import nn

        class Loose(nn.Module):
            def __init__(self, **kwargs):
                super().__init__()
                self.kwargs = kwargs

        class Strict(nn.Module):
            def __init__(self, in_features, width):
                super().__init__()
                self.args = (in_features, width)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    loose = build_model({"name": "usermods_exact:Loose", "in_features": 3, "vocab_size": 9, "x": 1})
    assert loose.kwargs == {"in_features": 3, "vocab_size": 9, "x": 1}  # type: ignore[attr-defined]
    strict = build_model({"name": "usermods_exact:Strict", "in_features": 3, "out_features": 2, "width": 5})
    assert strict.args == (3, 5)  # type: ignore[attr-defined]
    with pytest.raises(UserError) as bad:
        build_model({"name": "usermods_exact:Strict", "in_features": 3, "widht": 5})
    assert str(bad.value) == (
        "model 'usermods_exact:Strict': cannot build it with {'in_features': 3, 'widht': 5} "
        "(Strict.__init__() got an unexpected keyword argument 'widht'); see model.kwargs"
    )
    assert bad.value.__suppress_context__


def write_package(root: Path, name: str) -> Path:
    pkg = root / name
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "net.py").write_text(
        "from torch import nn\n\n\nclass Net(nn.Linear):\n    def __init__(self):\n        super().__init__(2, 2)\n"
    )
    (pkg / "__pycache__" / "junk.py").write_text("x = 1\n")
    (pkg / "notes.txt").write_text("not python\n")
    return pkg


def by_hand(files: list[Path], base: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(base).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def test_source_files_and_their_hash(tmp_path: Path) -> None:
    from trainflow.models import source_files, source_hash

    pkg = write_package(tmp_path, "pkg_exact")
    files = source_files(pkg)
    assert files == [pkg / "__init__.py", pkg / "sub" / "__init__.py", pkg / "sub" / "net.py"]
    assert source_files(pkg / "notes.txt") == [pkg / "notes.txt"]
    expected = hashlib.sha256(
        b"pkg_exact/__init__.py\0" + b"pkg_exact/sub/__init__.py\0" + b"pkg_exact/sub/net.py\0"
        + (pkg / "sub" / "net.py").read_bytes()
    ).hexdigest()  # fmt: skip
    assert source_hash(files, tmp_path) == expected
    assert source_hash([], tmp_path) == hashlib.sha256().hexdigest()


def test_user_source_of_a_packaged_and_of_a_single_module_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainflow.models import MLP, user_source

    pkg = write_package(tmp_path, "pkg_user_exact")
    (tmp_path / "single_exact.py").write_text(
        "from torch import nn\n\n\nclass One(nn.Linear):\n    def __init__(self):\n        super().__init__(1, 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from pkg_user_exact.sub.net import Net as PackagedNet  # type: ignore[import-not-found]
    from single_exact import One  # type: ignore[import-not-found]

    try:
        got = user_source(PackagedNet())
        assert got == {
            "module": "pkg_user_exact.sub.net",
            "source": str(pkg.resolve()),
            "sha256": by_hand([pkg / "__init__.py", pkg / "sub" / "__init__.py", pkg / "sub" / "net.py"], tmp_path),
            "file": str((pkg / "sub" / "net.py").resolve()),
        }
        single = (tmp_path / "single_exact.py").resolve()
        assert user_source(One()) == {
            "module": "single_exact",
            "source": str(single),
            "sha256": by_hand([single], single.parent),
            "file": str(single),
        }
        assert user_source(MLP(1, 1, [], 0.0)) is None
    finally:
        for name in [m for m in sys.modules if m.startswith(("pkg_user_exact", "single_exact"))]:
            del sys.modules[name]
