"""A new user's first `ask`: the bundled readers when no --checkpoint is given, and an index
without this reader's cache says which caches it has and how to build the missing one.

Only JSON manifests are written here (no model is loaded): the end-to-end run of the printed
command is in tests/open_domain/test_odqa_cli.py::test_index_ask_and_eval.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from dil_jax.cli import build_parser
from dil_jax.defaults import bundled_reader, default_reader_role
from dil_jax.open_domain.cache.missing import (
    CacheEntry,
    build_command,
    index_caches,
    missing_cache_message,
)
from dil_jax.open_domain.cache.storage import FLOAT32, Storage

# Committed under dil_jax/assets/: a checkout without them is broken, not a case to skip.
FULL = bundled_reader("full")
DELAYED = bundled_reader("delayed")
K4 = bundled_reader("delayed", 4)


def _fake_cache(index: Path, k: int, model: str, dtype: str = "float32") -> None:
    folder = index / f"cache-k{k}-{model[:8]}"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps(
        {"model": model, "num_lower_layers": k, "dtype": dtype}))


def _resolved(argv: list[str]):
    """The checkpoint(s) the command's requests name; its parsed flags are left as parsed."""
    from dil_jax.commands.arguments import ask_request, reader_requests

    args = build_parser().parse_args(argv)
    given = vars(args).copy()
    resolved = (ask_request(args).checkpoint if argv[0] == "ask"
                else [request.checkpoint for request in reader_requests(args)])
    assert vars(args) == given  # never written back into the flags
    return resolved


@pytest.mark.parametrize("k,index_ks,delayed_ks,role", [
    (0, (), (2, 4), "full"), (2, (), (2, 4), "delayed"), (4, (0,), (2, 4), "delayed"),
    (None, (), (2, 4), "full"),      # an empty index: the better reader (its error lists caches)
    (None, (0, 2), (2, 4), "full"),      # the demo index: both cached, the better reader
    (None, (2,), (2, 4), "delayed"),     # built for the delayed reader only
    (None, (4,), (2, 4), "delayed"),     # built for another bundled delayed reader only
    (None, (3,), (2, 4), "full"),        # a k no bundled reader was trained at: no guess
])
def test_default_reader_role(k, index_ks, delayed_ks, role):
    assert default_reader_role(k, index_ks, delayed_ks) == role


def test_ask_without_checkpoint_reads_with_the_bundled_readers(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    assert _resolved(["ask", "Q?", "--index", str(index)]) == str(FULL)
    assert _resolved(["ask", "Q?", "--index", str(index), "--k", "2"]) == str(DELAYED)
    # Another k than the delayed reader's: the bundled reader trained at that k.
    assert _resolved(["ask", "Q?", "--index", str(index), "--k", "4"]) == str(K4)
    _fake_cache(index, 4, "acfc4806aaaaaaaa")  # an index built for the k = 4 reader only
    assert _resolved(["ask", "Q?", "--index", str(index)]) == str(K4)
    _fake_cache(index, 2, "acfc4806cccccccc")  # the bundled delayed reader's own k
    assert _resolved(["ask", "Q?", "--index", str(index)]) == str(DELAYED)
    _fake_cache(index, 0, "4984ed27bbbbbbbb")
    assert _resolved(["ask", "Q?", "--index", str(index)]) == str(FULL)
    # An explicit --checkpoint is kept as given, 'default' (the raw MiniLM) included.
    assert _resolved(["ask", "Q?", "--index", str(index), "--checkpoint", "default"]) == "default"


def test_odqa_eval_and_index_pick_a_bundled_reader_per_k(tmp_path):
    assert _resolved(["odqa-eval", "--index", "I", "--data", "D", "--k", "0", "2", "4"]) == [
        str(FULL), str(DELAYED), str(K4)]
    assert DELAYED.name == "minilm-squad-k2-open" and K4.name == "minilm-squad-k4"
    assert _resolved(["index", "--out", "O", "--corpus", "wikipedia"]) == [str(FULL)]


def test_index_caches_reads_each_manifest(tmp_path):
    _fake_cache(tmp_path, 2, "acfc480611112222", "bfloat16")
    _fake_cache(tmp_path, 0, "4984ed2733334444")
    (tmp_path / ".cache-k3-12345678.partial").mkdir()  # a staging folder is no cache
    (tmp_path / "cache-k5-deadbeef").mkdir()  # no manifest: listed, fields unknown
    assert index_caches(tmp_path) == [
        CacheEntry("cache-k0-4984ed27", 0, FLOAT32, "4984ed2733334444"),
        CacheEntry("cache-k2-acfc4806", 2, Storage("bfloat16"), "acfc480611112222"),
        CacheEntry("cache-k5-deadbeef", None, None, None)]


def test_build_command_of_an_index_repeats_its_corpus_and_split():
    split = {"strategy": "windows", "sources": ["wikipedia", "squad:my dev.json"], "limit": 50}
    command = build_command("runs/wiki", split, 128, 64, "runs/reader", 3, Storage("int8"), None)
    assert shlex.split(command) == [
        "dil-jax", "index", "--out", "runs/wiki", "--corpus", "wikipedia",
        "--corpus", "squad:my dev.json", "--corpus-limit", "50", "--split", "windows",
        "--max-passage-len", "128", "--doc-stride", "64", "--checkpoint", "runs/reader",
        "--k", "3"]
    # int8 is what `index` builds without the flag (at k = 0, whose cache holds token ids,
    # float32): only another storage is named.
    assert shlex.split(build_command("runs/wiki", split, 128, 64, "R", 3, FLOAT32))[-2:] == [
        "--cache-dtype", "float32"]
    assert shlex.split(build_command("runs/wiki", split, 128, 64, "R", 0, FLOAT32))[-2:] == [
        "--k", "0"]


def test_build_command_of_a_demo_index_is_a_demo_run():
    split = {"strategy": "paragraphs", "sources": ["wikipedia"], "distractors": 2000,
             "max_passage_len": 192, "doc_stride": 96}
    assert build_command("runs/demo-index", split, 192, 96, "R", 3, Storage("int8")) == (
        "dil-jax demo --index runs/demo-index --delayed-checkpoint R --k 3")
    assert build_command("runs/demo-index", split, 192, 96, "R", 3, FLOAT32) == (
        "dil-jax demo --index runs/demo-index --delayed-checkpoint R --k 3 --cache-dtype float32")
    assert build_command("runs/demo-index", split, 192, 96, "R", 0, FLOAT32) == (
        "dil-jax demo --index runs/demo-index --full-checkpoint R")


def test_message_lists_the_caches_and_the_fix():
    caches = [CacheEntry("cache-k0-4984ed27", 0, FLOAT32, "4984ed2733334444"),
              CacheEntry("cache-k2-acfc4806", 2, FLOAT32, "acfc480611112222")]
    message = missing_cache_message(
        "runs/demo-index", "cache-k3-acfc4806", "R", 3, FLOAT32, caches,
        {"acfc480611112222": "this reader's weights"}, "dil-jax demo --index runs/demo-index "
        "--delayed-checkpoint R --k 3")
    assert message.splitlines() == [
        "runs/demo-index: no passage cache here for the reader R at k = 3, float32 (it would "
        "be cache-k3-acfc4806)",
        "  the index has:",
        "    cache-k0-4984ed27: k = 0, float32, model 4984ed27",
        "    cache-k2-acfc4806: k = 2, float32, model acfc4806 (this reader's weights)",
        "  this reader's weights are cached at k = 2, float32: read with --k 2 --cache-dtype "
        "float32 to use it",
        "  build it with: dil-jax demo --index runs/demo-index --delayed-checkpoint R --k 3"]


def test_missing_cache_error_is_a_diljax_error():
    from dil_jax.errors import DilJaxError
    from dil_jax.open_domain.cache.missing import MissingCacheError
    from dil_jax.open_domain.cache.store import CacheMismatchError

    assert issubclass(MissingCacheError, CacheMismatchError)
    assert issubclass(MissingCacheError, DilJaxError)
