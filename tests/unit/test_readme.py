"""The README's commands agree with what the repository provides."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_lists_every_make_target_that_make_help_shows() -> None:
    """The sentence "`make help` lists every target (...)" names exactly the Makefile's documented targets."""
    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-z0-9-]+):.*## ", makefile, flags=re.MULTILINE)
    readme = " ".join((ROOT / "README.md").read_text().split())
    sentence = re.search(r"`make help` lists every target \(([^)]*)\)", readme)
    assert sentence is not None
    listed = re.findall(r"`([a-z0-9-]+)`", sentence.group(1))
    assert sorted(listed) == sorted(t for t in targets if t != "help")
