"""`dil-jax predict`: a checkpoint over a SQuAD JSON file -> a predictions JSON (qid -> answer)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spiece.model")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict", help="answer the questions of a SQuAD file",
        description="Reads a SQuAD v1.1/v2.0 JSON file with a reader checkpoint and writes the "
                    "official predictions format ({question id: answer}).")
    parser.add_argument("--checkpoint", default="default",
                        help="'default' (the embedded MiniLM), a Hugging Face folder, or a "
                             "dil_jax (orbax) checkpoint folder")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder (default: the checkpoint's own files)")
    parser.add_argument("--data", required=True, help="SQuAD JSON file")
    parser.add_argument("--output", required=True, help="predictions JSON to write")
    parser.add_argument("--k", type=int, default=None,
                        help="split point: blocks run on question and passage separately "
                             "(default: the checkpoint's; 0 for a Hugging Face one)")
    parser.add_argument("--max-question-len", type=int, default=64)
    parser.add_argument("--max-passage-len", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-answer-length", type=int, default=30, help="in tokens")
    parser.add_argument("--n-best", type=int, default=20)
    parser.add_argument("--null-threshold", type=float, default=None,
                        help="SQuAD 2.0: answer '' when null - best span score exceeds this "
                             "(default 0.0 for a v2.0 file; v1.1 files always get an answer)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument("--cache-dir", default=None, help="cache featurized inputs here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def load_reader(checkpoint: str, k: int | None, max_question_len: int,
                tokenizer_path: str | None = None):
    """(model, params, tokenizer) from a dil_jax (orbax) folder or a Hugging Face checkpoint."""
    from dil_jax.checkpoints import ENCODER_CONFIG_FILE, load_hf_checkpoint, load_params
    from dil_jax.model import DelayedInteractionModel
    from dil_jax.tokenization import load_tokenizer

    overrides = {"max_question_len": max_question_len}
    if k is not None:
        overrides["num_lower_layers"] = k
    folder = Path(checkpoint).expanduser()
    if (folder / ENCODER_CONFIG_FILE).is_file():
        config, params = load_params(folder, **overrides)
        if tokenizer_path is None:
            if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
                raise FileNotFoundError(f"{folder}: a dil_jax checkpoint without tokenizer files; "
                                        "pass --tokenizer (e.g. the folder it was converted from)")
            tokenizer_path = str(folder)
    else:
        config, params, _ = load_hf_checkpoint(checkpoint, **overrides)
    tokenizer = load_tokenizer(tokenizer_path or checkpoint)
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the checkpoint's vocabulary "
                         f"is {config.vocab_size}: not this checkpoint's tokenizer")
    return DelayedInteractionModel(config), params, tokenizer


def run(args: argparse.Namespace) -> int:
    from dil_jax.data.squad import load_squad
    from dil_jax.predict import predict_squad

    dataset = load_squad(args.data)
    examples = dataset.examples[:args.limit] if args.limit is not None else dataset.examples
    if not examples:
        raise ValueError(f"{args.data}: no questions to answer")
    null_threshold = args.null_threshold
    if null_threshold is None and dataset.version == "2.0":
        null_threshold = 0.0
    model, params, tokenizer = load_reader(args.checkpoint, args.k, args.max_question_len,
                                           args.tokenizer)
    started = time.perf_counter()
    predictions = predict_squad(
        model, params, tokenizer, examples, max_passage_len=args.max_passage_len,
        doc_stride=args.doc_stride, batch_size=args.batch_size,
        max_answer_length=args.max_answer_length, n_best=args.n_best,
        null_threshold=null_threshold, progress=not args.no_progress, cache_dir=args.cache_dir)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(predictions, ensure_ascii=False, indent=1), encoding="utf-8")
    os.replace(temporary, output)
    log.info("%d predictions (k=%d) in %.1f s -> %s", len(predictions),
             model.config.num_lower_layers, time.perf_counter() - started, output)
    return 0
