"""The model card's HTML page in a real browser (issue 27 item 4): headless Chromium loads the self-contained page,
decodes each embedded plot (its natural size, read by the page itself) and paints it: the screenshot has the plots'
colours, which the same page with its images emptied has not.

Chromium comes from the system (Debian: `apt-get install chromium`; .ci/run installs it where it can). Without it
this test is skipped, saying so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.projects import blobs

from trainflow.core.paths import Paths
from trainflow.params import load_params
from trainflow.stages import STAGES, run_stage

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium here (Debian: apt-get install chromium)")

# Run after the page's load event: the title reports, per <img>, whether it decoded and its natural width.
REPORT = (
    "<script>addEventListener('load', () => { document.title = 'images:' + "
    "[...document.images].map(i => i.complete ? i.naturalWidth : -1).join(','); });</script>"
)


def chromium(page: Path, *args: str) -> str:
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000",
           *args, page.as_uri()]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def coloured(png: Path) -> int:
    """Pixels of a clear colour (a plot's lines, bars and colour maps; text and rules are grey)."""
    rgb = np.asarray(Image.open(png).convert("RGB")).astype(int)
    return int(((rgb.max(axis=2) - rgb.min(axis=2)) > 60).sum())


@pytest.mark.slow  # a pipeline and a headless Chromium (~15 s)
def test_the_card_renders_its_plots_in_headless_chromium(csv_project: Path, tmp_path: Path) -> None:
    paths = Paths(csv_project)
    blobs(n=300, separation=1.5).to_csv(csv_project / "data/raw/blobs.csv", index=False)
    for stage in STAGES:
        run_stage(stage, load_params(paths.params), paths)
    html = (paths.reports / "card.html").read_text()

    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</head>", REPORT + "</head>", 1) if "</head>" in html else REPORT + html)
    title = re.search(r"<title>images:([-\d,]*)</title>", chromium(probe, "--dump-dom"))
    assert title, "the page's script did not run"
    widths = [int(w) for w in title.group(1).split(",")]
    assert len(widths) == 3 and min(widths) > 100, widths  # three plots, each decoded as a real picture

    shots = {}
    for name, text in (("card", html), ("no-images", re.sub(r'src="data:image/png;base64,[^"]*"', 'src=""', html))):
        page = tmp_path / f"{name}.html"
        page.write_text(text)
        shots[name] = tmp_path / f"{name}.png"
        chromium(page, f"--screenshot={shots[name]}", "--window-size=1000,4000")
    card, bare = coloured(shots["card"]), coloured(shots["no-images"])
    assert card > 20 * max(bare, 100), (card, bare)  # the plots are painted, not a broken-image icon or alt text
