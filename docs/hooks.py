"""mkdocs hook: the reference pages are generated from the code at every build, so they cannot drift from it.

reference/cli.md is every `trainflow` command's --help, as argparse prints it; reference/params.md is every field of
params.yaml from the pydantic models that validate it (its key, type, default and description). Neither is a file in
docs/: `mkdocs build --strict` (in scripts/test.sh) fails if the nav names a page that no longer exists.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any

from mkdocs.structure.files import File, Files
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

CLI_PAGE = "reference/cli.md"
PARAMS_PAGE = "reference/params.md"


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """(command path, help text) of the parser and every subcommand, depth first, in the parser's order."""
    found = [(prefix, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*prefix, name))
    return found


def cli_reference() -> str:
    import os

    from trainflow.cli import build_parser

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps to the terminal; the page should not depend on it
    parts = ["# CLI\n", "Every `trainflow` command's `--help`, generated from the code at each docs build.\n"]
    for path, text in commands(build_parser()):
        title = " ".join(("trainflow", *path))
        parts.append(f"## `{title}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def _type(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    return text.replace("trainflow.params.", "")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value, default=str)


def _section_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (types.UnionType, typing.Union) and len(args) == 1:
        return _section_model(args[0])
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        nested = _section_model(field.annotation)
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        if nested is not None:
            rows.append(f"| `{key}` | section | | {description} |")
            rows += _rows(nested, f"{key}.")
        else:
            default = _default(field).replace("|", "\\|")
            kind = _type(field.annotation).replace("|", "\\|")
            rows.append(f"| `{key}` | `{kind}` | `{default}` | {description} |")
    return rows


def params_reference() -> str:
    from trainflow.params import PipelineParams

    parts = [
        "# params.yaml\n",
        "Every key of params.yaml, generated from the pydantic models that validate it (`trainflow/params/`) at each "
        "docs build. Set one on the command line with `-S key=value` (`trainflow run -S train.lr=3e-4`); "
        "`trainflow params check` validates a file and `trainflow params schema` prints the JSON Schema.\n",
    ]
    for name, field in PipelineParams.model_fields.items():
        nested = _section_model(field.annotation)
        parts.append(f"## `{name}`\n\n{' '.join((field.description or '').split())}\n")
        header = "| key | type | default | description |\n|---|---|---|---|"
        if nested is None:
            parts.append(f"{header}\n| `{name}` | `{_type(field.annotation)}` | `{_default(field)}` | |\n")
        else:
            parts.append(header + "\n" + "\n".join(_rows(nested, f"{name}.")) + "\n")
    return "\n".join(parts)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, CLI_PAGE, content=cli_reference()))
    files.append(File.generated(config, PARAMS_PAGE, content=params_reference()))
    return files
