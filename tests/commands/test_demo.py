"""The README's main job, on a small corpus: the bundled readers answer a factual question."""

from __future__ import annotations

import json
from types import SimpleNamespace

from dil_jax.cli import main
from dil_jax.defaults import bundled_reader
from dil_jax.open_domain.cache.location import Location
from dil_jax.open_domain.cache.storage import DEFAULT_STORAGE, FLOAT32, Storage
from dil_jax.open_domain.index.folder import OpenDomainIndex


def test_demo_answers_with_the_bundled_readers(tmp_path, capsys):
    assert bundled_reader("full") is not None and bundled_reader("delayed") is not None
    code = main(["demo", "--index", str(tmp_path / "index"), "--distractors", "20",
                 "--top-p", "5", "What is the fifth planet from the Sun?"])
    assert code == 0
    out = capsys.readouterr().out
    full, delayed = out.split("[delayed reader, k=2 of 6]")
    assert "[full reader, k=0 of 6]" in full
    # Jupiter's lead section ("Jupiter is the fifth planet from the Sun") is in the corpus;
    # both readers must find it and answer with its name.
    assert "A: Jupiter\n" in full
    assert "A: Jupiter\n" in delayed and "from 'Jupiter'" in delayed
    assert "reader time over 1 questions" in out
    assert out.count("reader score (logits)") == 2  # the default rule, both readers

    # The same index again (reused), both readers scoring spans over their no-answer score.
    code = main(["demo", "--index", str(tmp_path / "index"), "--distractors", "20",
                 "--top-p", "5", "--span-score", "margin",
                 "What is the fifth planet from the Sun?"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("reader score (margin)") == 2
    assert out.count("A: Jupiter\n") == 2

    # The demo's new caches are int8 (a quarter of float32's disk); `ask` without --cache-dtype
    # reads the storage the cache was built with, and naming another is refused by flag.
    delayed_cache = [d for d in (tmp_path / "index").glob("cache-k2-*")]
    assert len(delayed_cache) == 1
    assert json.loads((delayed_cache[0] / "manifest.json").read_text())["dtype"] == "int8"
    ask = ["ask", "What is the fifth planet from the Sun?", "--index", str(tmp_path / "index"),
           "--k", "2", "--top-p", "5"]
    assert main(ask) == 0
    assert "from 'Jupiter'" in capsys.readouterr().out
    assert main(ask + ["--cache-dtype", "float32"]) != 0
    assert "give --cache-dtype int8 to read it" in capsys.readouterr().err


class _Index:
    """The parts of an index `storage_to_build` reads: one reader's cache folder, finished
    (a manifest naming `built`), unfinished (a staging folder whose plan names `built`) or
    absent."""

    def __init__(self, tmp_path, state: str, built: str = "float32"):
        self.folder = tmp_path / "cache-k4-x"
        if state == "finished":
            self.folder.mkdir(parents=True)
            (self.folder / "manifest.json").write_text(json.dumps({"dtype": built}))
        elif state == "unfinished":
            staging = tmp_path / ".cache-k4-x.partial"
            staging.mkdir(parents=True)
            (staging / "plan.json").write_text(json.dumps({"dtype": built}))
        self.built = Storage.parse(built)

    def cache_key(self, reader, storage):
        return storage

    def cache_dir(self, key):
        return self.folder

    def cache_location(self, key):
        return Location.of(self.folder)

    def built_storage(self, reader):
        return self.built


_READER = SimpleNamespace(config=SimpleNamespace(hidden_size=384, num_lower_layers=4))


def _storage_to_build(index: _Index, asked: Storage | None) -> Storage:
    return OpenDomainIndex.storage_to_build(index, _READER, asked)


def test_a_new_cache_is_int8_and_an_existing_or_unfinished_one_keeps_its_storage(tmp_path):
    # The default of `index` and `demo`: int8 (issue 60's storage table chose it).
    assert DEFAULT_STORAGE == Storage("int8")
    assert _storage_to_build(_Index(tmp_path / "a", "absent"), None) == Storage("int8")
    # A cache built before (float32 was the default of `index` then) is kept, and an unfinished
    # build resumes in the storage it was started with, rather than starting over as int8.
    assert _storage_to_build(_Index(tmp_path / "b", "finished"), None) == FLOAT32
    assert _storage_to_build(_Index(tmp_path / "c", "unfinished"), None) == FLOAT32
    assert _storage_to_build(_Index(tmp_path / "d", "unfinished", "pq64"), None) == Storage("pq64")
    # Asked for, it is what is built (a mismatch with a finished cache is refused later).
    assert _storage_to_build(_Index(tmp_path / "e", "finished"),
                             Storage("bfloat16")) == Storage("bfloat16")
