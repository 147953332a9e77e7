"""New data arriving: `trainflow data add FILE` and `trainflow data watch FOLDER`.

`add` puts a new file where `data.source` reads it (a folder or a glob under data/raw/), after reading it as ingest
will (so a malformed row or a missing column is refused before the file lands: nothing half-written, nothing added),
tracks it with DVC and emits the Prefect event `trainflow.data.added`. `trainflow deploy` (and prefect.yaml) serve
the training deployment with a trigger on that event, so a retrain starts when data lands, besides the cron. A file
byte-identical to one the source already holds is not added and emits nothing: no retrain for data already there.

The event's resource is `trainflow.project.<deploy.name>`: the deployment of that name (one per Prefect server, as
its name is) is the one that retrains.

`watch` polls an inbox folder (outside data/raw/): a file whose size and modification time hold still across one
poll is added as `add` would, then moved to the inbox's `added/` folder, or to `rejected/` beside a `.why.txt` that
says what to fix.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from trainflow.core import workspace
from trainflow.core.errors import DataError, ServiceError, UserError
from trainflow.core.io import atomic_path
from trainflow.core.paths import Paths
from trainflow.data.sources import FORMAT_BY_SUFFIX, IMAGE_SUFFIXES, read_source, resolve_files
from trainflow.params import GLOB_CHARS, RAW, PipelineParams, load_params, source_outside

EVENT = "trainflow.data.added"
ADDED, REJECTED = "added", "rejected"  # the watched inbox's folders for handled files
CHUNK = 1 << 20


def resource_id(deployment: str) -> str:
    """The Prefect resource a data-arrival event is about: the deployment of that name retrains on it."""
    return f"trainflow.project.{deployment}"


@dataclass
class Added:
    file: str  # where it went, relative to the project (or the file it duplicates)
    sha256: str
    rows: int
    new: bool  # False: byte-identical to `file`, already in the source; nothing added
    event: bool = False  # a trainflow.data.added event reached the Prefect server


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def destination(params: PipelineParams, paths: Paths, file: Path) -> Path:
    """Where `file` goes for `data.source` to read it: into the folder it names, or the folder of its glob. A source
    that names one file, a built-in dataset or a place outside data/raw/ cannot take more files: UserError with the
    setting that can."""
    source = params.data.source
    example = f"data.source: {RAW}/<name>/ (a folder; or a glob such as {RAW}/<name>/*{file.suffix or '.csv'})"
    if source.startswith("builtin:"):
        raise UserError(
            f"trainflow data add: data.source is {source}, a dataset inside a package, which takes no files. Set "
            f"{example} in {paths.params}, and data.target to the column to predict; the folder is made if missing"
        )
    if outside := source_outside(source, paths.root):
        raise UserError(f"trainflow data add: data.source: {outside}")
    full = paths.root / source
    if GLOB_CHARS.search(source):
        folder = next(p for p in full.parents if not GLOB_CHARS.search(p.as_posix()))
        dest = folder / file.name
        if not fnmatch(dest.as_posix(), full.as_posix()):
            raise UserError(
                f"trainflow data add: {file.name} would not match data.source {source}, so ingest would not read it; "
                "rename the file to match, or widen the glob in params.yaml"
            )
        return dest
    if full.is_file():
        raise UserError(
            f"trainflow data add: data.source names one file ({source}); new files go beside it when data.source "
            f"names their folder or a glob. Set data.source: {Path(source).parent.as_posix()}/*{Path(source).suffix} "
            f"in {paths.params} and rerun"
        )
    if full.suffix.lower() in FORMAT_BY_SUFFIX and not full.exists():
        raise UserError(
            f"trainflow data add: data.source {source} names a file that does not exist; set it to the folder the "
            f"files go in ({example}) in {paths.params} and rerun"
        )
    return full / file.name  # a folder (made when missing)


def add(paths: Paths, files: list[Path], emit: bool = True) -> list[Added]:
    """Add each of `files` to the project's data source (see the module doc); refuses all before adding any when one
    is malformed. The workspace is held meanwhile, so a running pipeline never reads a half-added folder."""
    params = load_params(paths.params)
    out: list[Added] = []
    with workspace.hold(paths.root, "trainflow data add"):
        plan = []
        for file in files:
            if not file.is_file():
                raise UserError(f"trainflow data add: {file} is not a file")
            dest = destination(params, paths, file)
            digest = sha256_of(file)
            if same := _identical(params, paths, file, digest):
                out.append(Added(_shown(same, paths.root), digest, 0, new=False))
                continue
            if dest.exists():
                raise UserError(
                    f"trainflow data add: {_shown(dest, paths.root)} already exists with other content; give the new "
                    "file another name (files of a source are added, never replaced)"
                )
            rows = _check(params, paths, file)
            plan.append((file, dest, digest, rows))
        for file, dest, digest, rows in plan:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest) as tmp:
                shutil.copyfile(file, tmp)
            if sha256_of(dest) != digest:
                dest.unlink()
                raise UserError(f"trainflow data add: {file} changed while it was copied; add it once it is whole")
            _dvc_add(paths, dest)
            out.append(Added(_shown(dest, paths.root), digest, rows, new=True))
    new = [a for a in out if a.new]
    if emit and new:
        sent = emit_events(params.deploy.name, paths, new)
        for a in new:
            a.event = sent
    return out


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _identical(params: PipelineParams, paths: Paths, file: Path, digest: str) -> Path | None:
    """A file of the source with the same bytes as `file`, if any (only files of its size are hashed)."""
    try:
        existing = resolve_files(params.data.source, paths.root)
    except DataError:  # no file yet (an empty or missing folder, a glob that matches nothing)
        return None
    size = file.stat().st_size
    return next((p for p in existing if p.stat().st_size == size and sha256_of(p) == digest), None)


def _check(params: PipelineParams, paths: Paths, file: Path) -> int:
    """Read `file` as ingest reads the source (same format, delimiter, encoding, header): a malformed row is a
    DataError naming the file and line. Its columns must be those of the last ingest. Returns its rows."""
    if file.suffix.lower() in IMAGE_SUFFIXES:
        return 1  # an image file in a class folder: ingest checks that it decodes
    d = params.data.model_copy(update={"source": str(file.resolve())})
    try:
        table = read_source(d, paths.root)
    except DataError as exc:
        raise DataError(f"not added: {exc}") from None
    if paths.schema.is_file():
        from trainflow.data.schema import Schema

        schema = Schema.read(paths.schema)
        if schema.data_params.get("source") == params.data.source:
            expected = [*schema.features, *schema.carried, schema.target]
            if schema.text_column:
                expected.append(schema.text_column)
            have = [str(c) for c in table.frame.columns]
            missing = [c for c in expected if c not in have]
            extra = [c for c in have if c not in expected]
            if missing or extra:
                parts = [f"lacks {missing}" if missing else "", f"has extra {extra}" if extra else ""]
                raise DataError(
                    f"not added: {file} has other columns than data.source {params.data.source}: it "
                    f"{' and '.join(p for p in parts if p)}; files of one source must have the same columns"
                )
    return len(table.frame)


def _dvc_add(paths: Paths, dest: Path) -> None:
    """Track the new file with DVC (`dvc add FILE`; inside a folder tracked as a whole, the README's `dvc add
    data/raw/<folder>`, DVC updates that folder's .dvc file instead). Nothing to do in a project without DVC."""
    if not (paths.root / ".dvc").is_dir():
        return
    shown = _shown(dest, paths.root)
    proc = subprocess.run(
        [sys.executable, "-m", "dvc", "add", "--quiet", shown], cwd=paths.root, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise UserError(
            f"trainflow data add: {shown} is in place but `dvc add {shown}` failed: "
            f"{(proc.stderr or proc.stdout).strip() or f'exit code {proc.returncode}, no output'}; fix that and run it "
            "yourself"
        )


def emit_events(deployment: str, paths: Paths, added: list[Added]) -> bool:
    """One `trainflow.data.added` event per new file, sent to the Prefect server of PREFECT_API_URL; False (and a line
    saying how to retrain) when none is set. A server that does not take them is a ServiceError: the files are in
    place, and `trainflow run` retrains on them."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        print(
            "trainflow data add: PREFECT_API_URL is not set, so no deployment hears of it; run `trainflow run` to "
            "retrain now",
            file=sys.stderr,
        )
        return False
    from prefect.events import Event
    from prefect.events.schemas.events import Resource

    resource = Resource({"prefect.resource.id": resource_id(deployment), "prefect.resource.name": str(paths.root)})
    events = [
        Event(event=EVENT, resource=resource, payload={"file": a.file, "sha256": a.sha256, "rows": a.rows})
        for a in added
    ]
    try:
        asyncio.run(_send(events))
    except Exception as exc:  # noqa: BLE001 - any failure to deliver: the server is unreachable or refused them
        raise ServiceError(
            f"the files are in place, but the Prefect server at {url} did not take the {EVENT} event ({exc}); "
            "run `trainflow run` to retrain, or rerun nothing and let the cron pick the files up"
        ) from None
    return True


async def _send(events: list[Any]) -> None:
    from prefect.events.clients import get_events_client

    async with get_events_client(reconnection_attempts=2) as client:
        for event in events:
            await client.emit(event)


def watch(paths: Paths, inbox: Path, interval_s: float = 5.0, once: bool = False) -> int:
    """Poll `inbox` and add each file that held still across a poll (see the module doc); `once`: handle what is
    there now and return. Returns how many files were added."""
    if not inbox.is_dir():
        raise UserError(f"trainflow data watch: {inbox} is not a folder; make it, or name the folder files arrive in")
    raw = (paths.root / RAW).resolve()
    if inbox.resolve().is_relative_to(raw):
        raise UserError(
            f"trainflow data watch: {inbox} is under {RAW}/, where the source's files live; watch a folder outside it "
            "(an inbox the files arrive in), and they are copied into data.source from there"
        )
    seen: dict[Path, tuple[int, int]] = {}
    count = 0
    print(f"trainflow: watching {inbox} for new data files (Ctrl-C stops)", file=sys.stderr, flush=True)
    while True:
        now = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in _arrivals(inbox)}
        ready = [p for p, stat in now.items() if once or seen.get(p) == stat]
        for file in sorted(ready):
            count += _take(paths, inbox, file)
            now.pop(file)
        if once:
            return count
        seen = now
        time.sleep(interval_s)


def _arrivals(inbox: Path) -> list[Path]:
    return [p for p in inbox.iterdir() if p.is_file() and not p.name.startswith(".")]


def _take(paths: Paths, inbox: Path, file: Path) -> int:
    try:
        [result] = add(paths, [file])
    except UserError as exc:
        where = _move(file, inbox / REJECTED)
        where.with_name(where.name + ".why.txt").write_text(f"{exc}\n")
        print(f"trainflow data watch: rejected {file.name} (moved to {where}): {exc}", file=sys.stderr, flush=True)
        return 0
    _move(file, inbox / ADDED)
    if result.new:
        print(f"trainflow data watch: added {file.name} as {result.file} ({result.rows} rows)", flush=True)
        return 1
    print(f"trainflow data watch: {file.name} is byte-identical to {result.file}; nothing added", flush=True)
    return 0


def _move(file: Path, folder: Path) -> Path:
    """Move `file` into `folder`, under a free name (name, name.1, name.2, ...)."""
    folder.mkdir(exist_ok=True)
    dest, n = folder / file.name, 0
    while dest.exists():
        n += 1
        dest = folder / f"{file.name}.{n}"
    os.replace(file, dest)
    return dest
