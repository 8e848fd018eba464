"""docs/dashboards/*.png are drawn from the boards as they are: a board changed since its picture
was drawn fails here until scripts/render_dashboards.sh draws it again (from a real run through the
local stack) and writes the boards' hashes into docs/dashboards/boards.sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BOARDS = REPO / "grafana" / "dashboards"
PICTURES = REPO / "docs" / "dashboards"


def test_every_board_picture_was_drawn_from_the_board_as_it_is() -> None:
    stamp = PICTURES / "boards.sha256"
    assert stamp.is_file(), "no docs/dashboards/boards.sha256: run scripts/render_dashboards.sh"
    drawn = {}
    for line in stamp.read_text().splitlines():
        digest, _, name = line.partition("  ")
        drawn[name] = digest
    boards = sorted(BOARDS.glob("*.json"))
    assert boards
    stale = [b.name for b in boards if drawn.get(b.name) != hashlib.sha256(b.read_bytes()).hexdigest()]
    assert not stale, f"boards changed since docs/dashboards/ was drawn: {', '.join(stale)}; run scripts/render_dashboards.sh"
    for board in boards:
        assert (PICTURES / f"{board.stem}.png").is_file(), f"no picture of {board.name} in docs/dashboards/"
