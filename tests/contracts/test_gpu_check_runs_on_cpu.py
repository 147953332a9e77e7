"""bench/gpu_check.py --part speed, the one command a lent GPU's few minutes go to, runs through on the CPU with a
tiny model: every part reports, fp8 says why it cannot run here, and --record's page and row are written from its
figures. A slip in a rarely run script would otherwise cost the GPU's whole turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def lightning_installed() -> bool:
    try:
        import lightning  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow  # torch.compile of each part on 2 cores: about a minute
def test_the_speed_part_runs_on_the_cpu_and_records_its_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = ["--device", "cpu", "--layers", "1", "--d-model", "64", "--min-len", "8", "--max-len", "32",
            "--batch-size", "16", "--n-train", "320", "--raw-steps", "16", "--engine-rows", "1000",
            "--engine-repeats", "1"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--part", "speed", *tiny],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    speed = figures["speed"]
    assert set(speed["engine"]["per_batch_size"]) == {"32", "128", "512"}
    assert speed["engine"]["ours_compile"] == "reduce-overhead"
    for layout in ("padded", "packed"):
        assert speed["packing"][layout]["ours"]["tokens_per_s"] > 0 and speed["packing"][layout]["raw"]["intervals"]
    assert speed["fp8"]["bf16"]["val_accuracy"] is not None
    assert speed["fp8"]["fp8"]["skipped"].startswith("train.precision: fp8 needs an NVIDIA H100/H200-class GPU")
    if not lightning_installed():  # CI's slow tier: the bench extra is not installed
        assert speed["engine"]["ours_over_lightning"] is None
        assert "| MLP batch 512, reduce-overhead: samples/s vs Lightning | not run: Lightning is not installed" in (
            done.stdout
        )
    else:
        assert speed["engine"]["ours_over_lightning"] > 0
        assert "| MLP batch 512, reduce-overhead: samples/s vs Lightning | " in done.stdout
    assert speed["engine"]["per_batch_size"]["512"]["ours_over_raw"] > 0

    # --record: the page and the headline, written where they are pointed (here a temp folder, not the checkout)
    sys.path.insert(0, str(ROOT / "bench"))
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_check
    import record

    (tmp_path / "benchmarks").mkdir()
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    monkeypatch.setattr(record, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    gpu_check.write_speed_page(figures, ["--part", "speed", "--record", *tiny])
    page = (tmp_path / "benchmarks" / "gpu-speed.md").read_text()
    assert "cpu, driver n/a, torch" in page and "| MLP batch 32, reduce-overhead" in page
    row = json.loads((tmp_path / "results" / "gpu-speed.json").read_text())
    assert row["page"] == "benchmarks/gpu-speed.md" and row["met"] == "no" and "MFU" in row["headline"]
