"""JAX's persistent compilation cache of the compiling commands (dil_jax/compilation_cache.py):
where it goes (flags, DIL_JAX_COMPILATION_CACHE, JAX_COMPILATION_CACHE_DIR, XDG_CACHE_HOME), that
a second run reads what the first wrote, and that the flag and the variable turn it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dil_jax import compilation_cache as cc
from dil_jax.errors import UsageError

from tests.helpers import REPO

# ------------------------------------------------------------------ choosing the folder (pure)

@pytest.mark.parametrize("env, folder, source", [
    ({"HOME": "/h"}, "/h/.cache/dil_jax/jax", "default"),
    ({"HOME": "/h", "XDG_CACHE_HOME": "/x"}, "/x/dil_jax/jax", "default"),
    # The XDG spec: a relative XDG_CACHE_HOME is ignored.
    ({"HOME": "/h", "XDG_CACHE_HOME": "rel"}, "/h/.cache/dil_jax/jax", "default"),
    ({"HOME": "/h", cc.ENV: "1"}, "/h/.cache/dil_jax/jax", "default"),
    ({"HOME": "/h", cc.ENV: "/elsewhere"}, "/elsewhere", cc.ENV),
    ({"HOME": "/h", cc.ENV: "0"}, None, f"{cc.ENV}=0"),
    ({"HOME": "/h", cc.ENV: "Off"}, None, f"{cc.ENV}=Off"),
    ({"HOME": "/h", cc.JAX_ENV: "/j"}, "/j", cc.JAX_ENV),
    # Ours wins over JAX's own variable.
    ({"HOME": "/h", cc.JAX_ENV: "/j", cc.ENV: "/d"}, "/d", cc.ENV),
    ({"HOME": "/h", cc.JAX_ENV: "/j", cc.ENV: "no"}, None, f"{cc.ENV}=no"),
])
def test_the_environment_chooses_the_folder(env, folder, source, monkeypatch):
    monkeypatch.setenv("HOME", env["HOME"])  # Path.home()
    choice = cc.choose(None, False, env)
    assert choice == cc.CacheChoice(Path(folder) if folder else None, source)


def test_the_flags_win_over_the_environment():
    env = {"HOME": "/h", cc.ENV: "/d", cc.JAX_ENV: "/j"}
    assert cc.choose("/f", False, env) == cc.CacheChoice(Path("/f"), cc.FLAG)
    assert cc.choose(None, True, env) == cc.CacheChoice(None, cc.OFF_FLAG)
    assert cc.choose("/f", True, env).folder is None  # off beats a folder
    with pytest.raises(UsageError, match="--compilation-cache is empty"):
        cc.choose(" ", False, env)


def test_off_sets_only_the_switch_and_on_caches_every_program():
    assert cc.CacheChoice(None, "x").settings() == {"jax_enable_compilation_cache": False}
    on = cc.CacheChoice(Path("/c"), "default").settings()
    assert on["jax_compilation_cache_dir"] == "/c" and on["jax_enable_compilation_cache"]
    assert on["jax_persistent_cache_min_compile_time_secs"] == 0


def test_a_named_folder_that_is_a_file_is_one_line_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(UsageError) as caught:
        cc.usable(cc.CacheChoice(blocker, cc.FLAG))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--compilation-cache {blocker}: cannot use it")
    assert "--no-compilation-cache" in message


def test_the_default_folder_that_cannot_be_made_is_skipped_with_a_warning(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    choice = cc.usable(cc.CacheChoice(blocker / "dil_jax" / "jax", "default"))
    assert choice.folder is None
    assert "not caching compiled programs" in caplog.text


def test_usable_makes_the_folder(tmp_path):
    folder = tmp_path / "deep" / "cache"
    assert cc.usable(cc.CacheChoice(folder, cc.ENV)).folder == folder
    assert folder.is_dir()


# ------------------------------------------------------------- through the CLI, in subprocesses

# `dil-jax ask` with its run replaced by a tiny jitted function: the real parser, flags and
# dil_jax.cli.main apply the cache; the probe reports the folder JAX used and its cache hits.
_PROBE = """
import json, os, sys
import dil_jax.commands.odqa as odqa
from dil_jax import cli

def probe(args):
    import jax
    import jax.numpy as jnp
    from dil_jax.compilation_cache import active_folder

    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event.endswith("/cache_hits") else None)
    scale = float(os.environ["PROBE_SCALE"])  # a constant of the program: another program
    jax.jit(lambda x: jnp.sin(x) * scale)(jnp.arange(8.0)).block_until_ready()
    print(json.dumps({"folder": active_folder(), "hits": len(hits)}))
    return 0

odqa.run_ask = probe
code = cli.main(["ask", "q", "--index", "unused", *sys.argv[1:]])
import jax
print(json.dumps({"after": jax.config.jax_compilation_cache_dir}))
sys.exit(code)
"""


def _probe(tmp_path: Path, *flags: str, scale: float = 1.5, **env: str) -> dict:
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("JAX_", cc.ENV, "XDG_"))}  # conftest sets JAX's cache
    base.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
                PYTHONPATH=str(REPO), PROBE_SCALE=str(scale), JAX_PLATFORMS="cpu", **env)
    done = subprocess.run([sys.executable, "-c", _PROBE, *flags], cwd=tmp_path, env=base,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {**lines[0], **lines[1]}


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def test_a_second_run_reads_what_the_first_compiled(tmp_path):
    folder = tmp_path / "xdg" / "dil_jax" / "jax"
    first = _probe(tmp_path)
    assert first["folder"] == str(folder)
    written = _entries(folder)
    assert written, "the first run wrote no cache file"
    assert first["hits"] == 0
    second = _probe(tmp_path)
    assert second["hits"] >= 1  # read back, not compiled
    assert _entries(folder) == written  # and nothing new written
    assert second["after"] is None  # main() left JAX as it found it


def test_the_flag_and_the_variable_turn_it_off_or_move_it(tmp_path):
    default = tmp_path / "xdg" / "dil_jax" / "jax"
    off = _probe(tmp_path, "--no-compilation-cache")
    assert off["folder"] is None and not default.exists()
    off = _probe(tmp_path, **{cc.ENV: "0"})
    assert off["folder"] is None and not default.exists()
    moved = tmp_path / "moved"
    assert _probe(tmp_path, "--compilation-cache", str(moved))["folder"] == str(moved)
    assert _entries(moved) and not default.exists()
    by_env = tmp_path / "by-env"
    assert _probe(tmp_path, **{cc.ENV: str(by_env)})["folder"] == str(by_env)
    assert _entries(by_env) and not default.exists()


def test_an_unusable_cache_flag_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    done = subprocess.run(
        [sys.executable, "-m", "dil_jax", "ask", "q", "--index", str(tmp_path / "none"),
         "--compilation-cache", str(blocker)], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"dil-jax ask: error: --compilation-cache {blocker}: cannot use it as the compilation "
        "cache (a file, not a folder); give a writable folder, or --no-compilation-cache"]
