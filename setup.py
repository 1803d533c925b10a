"""dil_jax: Delayed Interaction Layers for transformer question answering in JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="dil_jax",
    version="0.1.0",
    description=(
        "Delayed Interaction Layers (DilBert, DilAlbert, DeFormer) and open-domain QA in JAX/Flax"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["dil_jax", "dil_jax.*"]),
    # The bundled fine-tuned readers (Hugging Face folders) and prescreener (orbax params, nested
    # folders), see dil_jax/assets/README.md; the service's web page and API page.
    package_data={"dil_jax": ["assets/*.md", "assets/**/*", "serve/*.html"]},
    install_requires=[
        "jax>=0.6",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "transformers>=4.40",
        "tokenizers>=0.19",
        "safetensors>=0.4",
        "ml-collections>=0.1.1",
        "numpy>=1.26",
        "scipy>=1.11",  # BM25's sparse term x passage matrix
        "ml_dtypes>=0.4",  # bfloat16 passage caches and exports
        "tqdm>=4.66",
        "rank-bm25>=0.2.2",
        "bm25s>=0.2.14,<0.3",  # BM25 for large corpora (memory-mapped; `--retriever`)
    ],
    extras_require={
        # torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
        "torch": ["torch==2.13.0"],
        # psutil: tools/peak_memory.py (the suite's peak memory in README); pytest-xdist: the
        # suite runs in two processes (README's test command), its tests mostly compiling;
        # selenium drives the page's browser test (Debian's chromium, tools/setup.sh).
        "test": ["pytest>=8", "pytest-xdist>=3.5", "ruff>=0.6", "psutil>=5.9",
                 "selenium>=4.20,<4.52"],
        "tfds": ["tensorflow-datasets>=4.9", "importlib_resources"],
        # tensorboardX writes the event files; matplotlib draws curves.png (dil-jax plot).
        "train": ["tensorboardX>=2.6", "matplotlib>=3.8"],
        # fastapi: only benchmarks/serve_frameworks.py (its overhead against Starlette's).
        "bench": ["matplotlib>=3.8", "torch==2.13.0", "fastapi>=0.115"],
        # `dil-jax serve` (docs/serving.md); httpx is what Starlette's TestClient and the
        # serve tests talk through.
        "serve": ["starlette>=0.37", "uvicorn>=0.30", "prometheus-client>=0.20", "httpx>=0.27"],
        # The Lucene retriever (`--retriever pyserini`): pyjnius here; the pyserini wheel itself
        # (only its Lucene jar is used) goes in with --no-deps (tools/setup.sh), since its
        # declared dependencies pull faiss, spacy, nmslib and a CUDA torch.
        "lucene": ["pyjnius>=1.6"],
        # `--cache-dtype pq<M>`: faiss trains the product quantizer's codebook when a cache is
        # built; reading one is numpy (dil_jax/open_domain/cache/storage.py). Pinned: the wheel
        # the tests and benchmarks/pq_variants.py ran with.
        "pq": ["faiss-cpu==1.15.1"],
    },
    entry_points={"console_scripts": ["dil-jax=dil_jax.cli:main"]},
)
