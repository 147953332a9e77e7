"""A user's own model class (model.name an import path, trainflow.models): where its code comes from."""

from __future__ import annotations

from pathlib import Path


class _UserModel:  # a model class of the user's (any module outside trainflow)
    pass


def test_a_user_models_source_names_its_module_and_file() -> None:
    """user_source of a model defined in this test module: its module and its file."""
    from trainflow.models import user_source

    got = user_source(_UserModel())  # type: ignore[arg-type]
    assert got is not None
    here = str(Path(__file__).resolve())
    assert (got["module"], got["file"]) == (__name__, here)
