"""Fixtures of the whole suite, and the environment every test process runs in.

Helpers that are not fixtures live in tests/helpers/ (`tests.helpers`). Tiny random Hugging
Face checkpoints are built locally with `transformers` (no download) and saved as real Hugging
Face folders (`hf_folder_factory`), so tests exercise the same import path a user's checkpoint
takes.

`tests/` is a package: pytest imports this file as `tests.conftest` with the repository root
first on `sys.path`, so the tests import this checkout's `dil_jax`, not whichever copy is
installed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dil_jax.errors import is_late_loop_callback

from tests.helpers import SHARED_DATA, V11, squad_file
from tests.helpers.hf import build_hf_qa_model

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The tests compile the same tiny train step many times (every train() call builds a new jit);
# a persistent compilation cache shared by the test process and its subprocesses makes every
# compilation after the first a cache hit.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/dil_jax_test_jax_cache")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# `--chunk-size auto` (serve's default) neither reads the user's record of this machine nor
# measures: the platform's default, as before it existed; tests/open_domain/test_chunk_size.py
# points the record elsewhere to test it.
os.environ.setdefault("DIL_JAX_CHUNK_SIZES", "off")


@pytest.fixture(scope="session", autouse=True)
def _ignore_orbax_reads_after_a_failed_restore():
    """Drops the one unraisable exception the suite expects before pytest's own unraisable hook
    sees it: after orbax fails to restore a damaged checkpoint (the tests that cut array files
    in half do so on purpose) or to save on a full disk, tensorstore's reads and writes still in
    flight finish on their own threads against the event loop orbax closed
    (`dil_jax.errors.is_late_loop_callback`); they land in whichever test runs when they end.
    Every other unraisable exception still warns."""
    pytest_hook = sys.unraisablehook

    def hook(unraisable):
        if not is_late_loop_callback(unraisable):
            pytest_hook(unraisable)

    sys.unraisablehook = hook
    yield
    sys.unraisablehook = pytest_hook


@pytest.fixture(scope="session")
def hf_folder_factory(tmp_path_factory):
    """Saves a tiny random HF QA model to a folder; returns (folder, torch model)."""
    cache = {}

    def make(arch: str, **overrides):
        key = (arch, tuple(sorted(overrides.items())))
        if key not in cache:
            model = build_hf_qa_model(arch, **overrides)
            folder = tmp_path_factory.mktemp(f"hf-{arch}")
            model.save_pretrained(str(folder), safe_serialization=True)
            cache[key] = (folder, model)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from dil_jax.defaults import default_checkpoint_dir

    folder = default_checkpoint_dir()
    assert (folder / "model.safetensors").is_file(), folder
    return folder


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), (
        f"{SHARED_DATA} is missing: tests need the shared data folder beside the repo root")
    return SHARED_DATA


@pytest.fixture(scope="module")
def tokenizer():
    """The embedded MiniLM's tokenizer ("default"), loaded once per module."""
    from dil_jax.tokenization import load_tokenizer

    return load_tokenizer("default")


@pytest.fixture(scope="module")
def v11():
    """The shared SQuAD v1.1 file (35 dev articles), loaded once per module."""
    from dil_jax.data.squad import load_squad

    return load_squad(squad_file(V11))
