"""Files written before the manifests became values (`ExportManifest`, `CacheKey` /
`CacheManifest`, `Bm25Manifest`, `PrescreenerManifest`) are read as they were: each reads back
to the same JSON, and an index built then opens and answers as the code that built it did.

tests/fixtures/index-written-before-typed-manifests/ was built and read at commit 40b77d2, from its
folder:

    dil-jax index --out index --corpus jsonl:corpus.jsonl --k 0 1 --checkpoint default \\
        --max-passage-len 32 --doc-stride 16 --max-question-len 16 --cache-dtype pca8

(the build lock `index/.lock` removed); answers.json holds what that commit's open-domain
reader answered over it (the raw MiniLM at question length 16, top_p=3, batch_size=2,
chunk_size=8, as below), per k: each question's candidates as [passage, BM25 rank, text, char
start, char end, reader score, BM25 score].
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dil_jax.checkpoints import ExportManifest
from dil_jax.defaults import bundled_reader
from dil_jax.open_domain.cache.manifest import CacheManifest
from dil_jax.open_domain.cache.storage import Storage
from dil_jax.open_domain.index.folder import open_index
from dil_jax.open_domain.reader import OpenDomainReader
from dil_jax.open_domain.retrieval.bm25 import Bm25Manifest
from dil_jax.prescreening.prescreener import BUNDLED_PRESCREENER, PrescreenerManifest
from dil_jax.readers import load_reader

from tests.helpers import FIXTURES

BEFORE = FIXTURES / "index-written-before-typed-manifests"
QUESTIONS = ["Who wrote Pride and Prejudice?", "When did Apollo 11 land on the Moon?",
             "What is the capital of France?"]


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_manifests_written_before_read_back_to_the_same_json():
    index = BEFORE / "index"
    for folder in sorted(index.glob("cache-k*")):
        written = _json(folder / "manifest.json")
        manifest = CacheManifest.from_json(written)
        assert manifest.to_json() == written
        assert manifest.key.storage == Storage.parse("pca8")
        assert manifest.key.folder_name == folder.name
    written = _json(index / "bm25" / "manifest.json")
    assert Bm25Manifest.from_json(written, index / "bm25").to_json() == written
    for folder in (bundled_reader("full"), bundled_reader("delayed"), bundled_reader("delayed", 4),
                   bundled_reader("full").parent / "minilm-squad-k2"):
        assert ExportManifest.read(folder).to_json() == _json(folder / "dil_jax_manifest.json")
    # The prescreener bundled before issue 63 (kept as a fixture: its config has no
    # `interaction` field) and today's.
    for folder in (FIXTURES / "prescreener-written-before", BUNDLED_PRESCREENER):
        written = _json(folder / "prescreener.json")
        assert PrescreenerManifest.from_json(written, folder).to_json() == written


@pytest.mark.parametrize("k", [0, 1])
def test_an_index_written_before_opens_and_answers_as_then(tmp_path, k):
    """The same candidates (texts, spans, ranks); reader scores within float32 rounding of
    another machine's (the stored states are the same bytes; the upper blocks run here)."""
    index = open_index(shutil.copytree(BEFORE / "index", tmp_path / "index"))
    reader = load_reader("default", k, 16)
    cache = index.open_cache(reader, Storage.parse("pca8"))
    read = OpenDomainReader(index, reader, cache, top_p=3, batch_size=2, chunk_size=8)
    candidates = read.read(QUESTIONS).candidates
    expected = _json(BEFORE / "answers.json")[f"k{k}"]
    assert [[[c.passage_index, c.rank, c.text, c.char_start, c.char_end] for c in question]
            for question in candidates] == [[row[:5] for row in question]
                                            for question in expected]
    np.testing.assert_allclose([c.reader_score for question in candidates for c in question],
                               [row[5] for question in expected for row in question], atol=1e-4)
    np.testing.assert_allclose([c.bm25_score for question in candidates for c in question],
                               [row[6] for question in expected for row in question], rtol=1e-9)


def test_k_is_recorded_once_and_old_readers_still_give_it():
    """A new export records k in `reader` only (the training config's model.num_lower_layers
    is derived from it on load); a bundled reader written before records it in both and reads
    as it did. A k that differs from the training run's is kept beside the exported one."""
    # minilm-squad-full was bundled before k was recorded once; minilm-squad-k4, -k2 (the
    # complete-set k = 2 student, bundled 2026-11-28) and -k2-open (2026-11-30) after.
    old = ExportManifest.read(bundled_reader("full"))
    assert old.training_config["model"]["num_lower_layers"] == old.reader["num_lower_layers"]
    assert old.trained_k == old.reader["num_lower_layers"] == 0
    for new_folder, k in ((bundled_reader("delayed"), 2), (bundled_reader("delayed", 4), 4),
                          (bundled_reader("full").parent / "minilm-squad-k2", 2)):
        new = ExportManifest.read(new_folder)
        assert "num_lower_layers" not in new.training_config["model"]
        assert new.trained_k == new.reader["num_lower_layers"] == k
    trained = {"model": {"num_lower_layers": 4, "max_question_len": 32}}
    once = ExportManifest(training_config=trained).with_reader({"num_lower_layers": 4})
    written = once.to_json()
    assert written["reader"] == {"num_lower_layers": 4}
    assert written["training_config"] == {"model": {"max_question_len": 32}}
    assert ExportManifest.from_json(written).trained_k == 4
    other = ExportManifest(training_config=trained).with_reader({"num_lower_layers": 2})
    assert other.training_config == trained and other.trained_k == 4
