"""Fixtures of the open-domain tests."""

from __future__ import annotations

import pytest

from tests.helpers.index import private_copy


@pytest.fixture
def index_copy(built, tmp_path):
    """A private copy of the module's `built` index -> (folder, corpus source).

    `built` is the requesting module's own fixture: (index folder, corpus source) of an index
    built once per module with that module's settings (`tests.helpers.index.build_sample_index`).
    """
    index, corpus = built
    return private_copy(index, tmp_path), corpus
