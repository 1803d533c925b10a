"""The README's main job, on a small corpus: the bundled readers answer a factual question."""

from __future__ import annotations

import json

from dil_jax.cli import main
from dil_jax.commands.demo import demo_storage
from dil_jax.defaults import bundled_reader
from dil_jax.open_domain.cache.storage import FLOAT32, Storage


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
    """An index whose cache of the reader exists or not, built with `built`."""

    def __init__(self, tmp_path, exists: bool, built: str):
        self.folder = tmp_path / "cache-k4-x"
        if exists:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.built = Storage.parse(built)

    def cache_key(self, reader, storage):
        return storage

    def cache_dir(self, key):
        return self.folder

    def built_storage(self, reader):
        return self.built


def test_demo_storage_keeps_an_existing_cache_and_defaults_to_int8(tmp_path):
    assert demo_storage(_Index(tmp_path / "a", False, "float32"), None, None) == Storage("int8")
    assert demo_storage(_Index(tmp_path / "b", True, "float32"), None, None) == FLOAT32
    assert demo_storage(_Index(tmp_path / "b", True, "float32"), None,
                        Storage("bfloat16")) == Storage("bfloat16")
