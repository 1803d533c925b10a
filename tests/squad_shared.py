"""Locating the shared SQuAD files (../shared/data/squad beside the repo root).

They are required, not optional: CI has them, so a missing folder fails with a clear message
instead of skipping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SQUAD_DIR = SHARED_DATA / "squad"
V11 = "dev-v1.1.35-articles.json"
V20 = "dev-v2.0.json"


def squad_file(name: str) -> Path:
    path = SQUAD_DIR / name
    if not path.is_file():
        pytest.fail(f"shared SQuAD file missing: {path}. The tests need the shared data folder "
                    f"beside the repo root (../shared/data/squad/), as CI provides it.",
                    pytrace=False)
    return path
