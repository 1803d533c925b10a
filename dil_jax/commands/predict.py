"""`dil-jax predict`: a checkpoint over a SQuAD JSON file -> a predictions JSON (qid -> answer)."""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import TYPE_CHECKING

from dil_jax.commands.arguments import (
    add_compilation_cache_arguments,
    add_matmul_argument,
    add_reading_arguments,
    finite_float,
    int_list,
    non_negative_int,
    option_type,
    positive_int,
    window_len,
)
from dil_jax.defaults import DOC_STRIDE, MAX_QUESTION_LEN, PREDICT_MAX_PASSAGE_LEN, READ_BATCH_SIZE

if TYPE_CHECKING:
    from dil_jax.checkpoints.resolved import ResolvedCheckpoint
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict", help="answer the questions of a SQuAD file",
        description="Reads a SQuAD v1.1/v2.0 JSON file with a reader checkpoint and writes the "
                    "official predictions format ({question id: answer}).")
    parser.add_argument("--checkpoint", default=None,
                        help="a reader folder (a Hugging Face or dil_jax export, or a dil_jax "
                             "orbax checkpoint), a hub id, or 'default' (the embedded MiniLM, "
                             "QA head untrained); default: the bundled reader of --k (the full "
                             "one without --k), as `ask` picks it")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder (default: the checkpoint's own files)")
    parser.add_argument("--allow-untrained-head", action="store_true",
                        help="read with a checkpoint that has no QA head (e.g. 'default'), its "
                             "head initialised at random: arbitrary answers, for timing and "
                             "plumbing tests; without it such a checkpoint is refused")
    parser.add_argument("--data", required=True, help="SQuAD JSON file")
    parser.add_argument("--output", required=True, help="predictions JSON to write")
    parser.add_argument("--k", type=option_type("num_lower_layers"), default=None,
                        help="split point: blocks run on question and passage separately "
                             "(default: the checkpoint's; 0 for a Hugging Face one)")
    parser.add_argument("--max-question-len", type=option_type("max_question_len"),
                        default=None,
                        help="tokens of `[CLS] question [SEP]`, padded; longer questions are "
                             "cut (default: the reader's own, the length it was trained with; "
                             f"{MAX_QUESTION_LEN} for a Hugging Face checkpoint without a "
                             "record)")
    parser.add_argument("--max-passage-len", type=window_len, default=None,
                        help="tokens of `passage [SEP]` per window; longer passages are read in "
                             "several windows (default: the windows the reader was trained on, "
                             "as its export records them: the bundled readers' 160; else "
                             f"BERT's {PREDICT_MAX_PASSAGE_LEN})")
    parser.add_argument("--doc-stride", type=option_type("doc_stride"), default=None,
                        help="tokens between window starts, < --max-passage-len (default: the "
                             f"reader's trained stride, else {DOC_STRIDE})")
    parser.add_argument("--batch-size", type=positive_int, default=READ_BATCH_SIZE,
                        help="windows per forward pass")
    parser.add_argument("--max-answer-length", type=positive_int, default=30, help="in tokens")
    parser.add_argument("--n-best", type=positive_int, default=20,
                        help="start and end candidates kept per window when decoding spans")
    parser.add_argument("--null-threshold", type=finite_float, default=None,
                        help="SQuAD 2.0: answer '' when null - best span score exceeds this "
                             "(default: the one a trained reader records, chosen on its "
                             "training questions, else 0.0; v1.1 files always get an answer)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="only the first N questions (default: all)")
    parser.add_argument("--cache-dir", default=None,
                        help="cache featurized inputs here (default: featurize afresh, nothing "
                             "kept)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--lsh-layers", type=lsh_layers, default=None,
                        help="read with Reformer LSH attention in these blocks: 'lower' (the "
                             "passage's lower blocks, 0..k-1) or comma-separated 0-based "
                             "layers (docs/architecture.md, 'Long passages'); a QANet: its "
                             "encoders by name, 'embedding' and/or 'model' (docs/qanet.md); "
                             "default: the reader's own attention (full, or a QANet's as "
                             "trained)")
    parser.add_argument("--lsh-num-hashes", type=option_type("lsh_num_hashes"), default=None,
                        help="hash rounds of --lsh-layers (default 2)")
    parser.add_argument("--lsh-bucket-size", type=option_type("lsh_bucket_size"), default=None,
                        help="tokens per chunk of --lsh-layers (default 64)")
    add_reading_arguments(parser, "")
    add_matmul_argument(parser)
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run)


def lsh_layers(text: str) -> str | tuple[int, ...] | tuple[str, ...]:
    """--lsh-layers: 'lower', comma-separated layer indices, or a QANet's encoder names."""
    from dil_jax.model.encoder_config import LOWER_BLOCKS
    from dil_jax.model.qanet_config import ENCODERS

    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if text.strip() == LOWER_BLOCKS:
        return LOWER_BLOCKS
    if names and all(name in ENCODERS for name in names):
        return names
    return int_list(non_negative_int)(text)


lsh_layers.__name__ = "'lower', comma-separated layers or QANet encoders"


def check_lsh_flags(args: argparse.Namespace) -> None:
    """Refuses --lsh-num-hashes / --lsh-bucket-size without --lsh-layers (before loading)."""
    from dil_jax.errors import UsageError

    if args.lsh_layers is None:
        for flag in ("lsh_num_hashes", "lsh_bucket_size"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} needs --lsh-layers")


def with_lsh_flags(reader: Reader, args: argparse.Namespace, checkpoint_name: str) -> Reader:
    """The Reader with the --lsh-* flags' LSH attention (the same params), or as it is: layers
    of the BERT family, encoders of a QANet (`Reader.with_lsh_attention`); checkpoint_name: what
    a refusal names."""
    from dil_jax.errors import UsageError
    from dil_jax.readers import LshLayersError

    if args.lsh_layers is None:
        return reader
    try:
        return reader.with_lsh_attention(args.lsh_layers, args.lsh_num_hashes,
                                         args.lsh_bucket_size, source="--lsh-layers")
    except LshLayersError as error:  # ConfigError (a bad layer) is named as it is
        raise UsageError(f"--lsh-layers {','.join(map(str, args.lsh_layers))}: "
                         f"{checkpoint_name} {error}") from None


def check_reader_flags(args: argparse.Namespace, checkpoint: ResolvedCheckpoint,
                       version: str) -> None:
    """UsageError naming the first flag (or a SQuAD 2.0 --data) the checkpoint's reader family
    cannot honour (`ReaderCapabilities`), before it loads: a QANet / BiDAF has no k (its split
    is fixed), no prescreening and no no-answer score."""
    from dil_jax.errors import UsageError
    from dil_jax.readers import reader_family

    kind = checkpoint.model_kind
    can = reader_family(kind).capabilities
    refused = {"--k": args.k is not None and not can.chosen_k and "its split is fixed (the "
               "embedding encoder per segment, the rest per pair)",
               "--prescreen": getattr(args, "prescreen", None) is not None and
               not can.prescreening and "prescreening reads BERT-family readers only",
               "--null-threshold": args.null_threshold is not None and not can.null_score and
               "it has no no-answer score"}
    for flag, why in refused.items():
        if why:
            raise UsageError(f"{flag}: {checkpoint.name} is a {kind} reader; {why}")
    if version == "2.0" and not can.null_score:
        raise UsageError(f"--data {args.data}: a SQuAD 2.0 file, but {checkpoint.name} is a "
                         f"{kind} reader without a no-answer score: give a SQuAD v1.1 file")


def reading_windows(args: argparse.Namespace, checkpoint) -> tuple[int, int]:
    """(max_passage_len, doc_stride) to read with: each flag as given, else what the reader
    records it was trained on (`ResolvedCheckpoint.trained_windows`), else BERT's 384 / 128.
    Logged with where each comes from; UsageError when the two do not make windows."""
    from dil_jax.commands.arguments import check_window_flags
    from dil_jax.errors import UsageError

    recorded = checkpoint.trained_windows
    source = "the reader's training windows" if recorded is not None else "the default"
    length = (args.max_passage_len if args.max_passage_len is not None
              else recorded.max_passage_len if recorded is not None else PREDICT_MAX_PASSAGE_LEN)
    stride = (args.doc_stride if args.doc_stride is not None
              else recorded.doc_stride if recorded is not None else DOC_STRIDE)
    if args.max_passage_len is not None and args.doc_stride is not None:
        check_window_flags(length, stride)
    elif stride >= length:
        unset = "--doc-stride" if args.doc_stride is None else "--max-passage-len"
        raise UsageError(f"--max-passage-len {length} with --doc-stride {stride}: {unset} is "
                         f"unset and comes from {source}, and windows need a stride smaller "
                         "than their length; pass both flags")
    if args.max_passage_len is None or args.doc_stride is None:
        log.info("passage windows of %d tokens every %d (%s; --max-passage-len and "
                 "--doc-stride set them)", length, stride,
                 source if args.max_passage_len is None and args.doc_stride is None
                 else f"the unset one from {source}")
    return length, stride


def _local(path: str | None) -> str | None:
    """A path flag's value, or None for 'default' (a bundled file, not one in the cwd)."""
    return None if path == "default" else path


def choose_null_threshold(version: str, flag: float | None, recorded: float | None
                          ) -> tuple[float | None, str]:
    """(null threshold for predict_squad, where it comes from). A v1.1 file: None (always an
    answer); v2.0: --null-threshold, else the reader's recorded one, else 0.0."""
    if version != "2.0":
        return None, "none: a SQuAD v1.1 file always gets an answer"
    if flag is not None:
        return flag, "--null-threshold"
    if recorded is not None:
        return recorded, "recorded by the reader (trained_from.json), chosen on training questions"
    return 0.0, "the default: the reader records none"


def run(args: argparse.Namespace) -> int:
    from dil_jax.atomic import check_output_path, write_atomic
    from dil_jax.checkpoints import resolve_reader_checkpoint
    from dil_jax.commands.arguments import check_window_flags, prescreen_from_args, require_file
    from dil_jax.data.squad import load_squad
    from dil_jax.errors import InputFileError
    from dil_jax.predict import predict_squad
    from dil_jax.readers import ReaderRequest, load_requested

    # Everything a flag can get wrong is refused here, before the model is loaded.
    if args.max_passage_len is not None and args.doc_stride is not None:
        check_window_flags(args.max_passage_len, args.doc_stride)
    check_lsh_flags(args)
    require_file(args.data, "--data", "SQuAD file")
    # Without --checkpoint: the bundled reader of --k (`ReaderRequest.resolved`, ask's rule).
    request = ReaderRequest(args.checkpoint, args.k, args.max_question_len, args.tokenizer,
                            matmul_dtype=args.matmul_dtype,
                            require_qa_head=not args.allow_untrained_head).resolved()
    check_output_path(args.output, "--output",
                      {"--data": args.data, "--checkpoint": _local(request.checkpoint),
                       "--tokenizer": args.tokenizer, "--cache-dir": args.cache_dir,
                       "--prescreen": _local(args.prescreen)})
    dataset = load_squad(args.data)
    examples = dataset.examples[:args.limit] if args.limit is not None else dataset.examples
    if not examples:
        raise InputFileError(f"--data {args.data}: no questions to answer")
    checkpoint = resolve_reader_checkpoint(request.checkpoint)
    max_passage_len, doc_stride = reading_windows(args, checkpoint)
    check_reader_flags(args, checkpoint, dataset.version)
    recorded = checkpoint.recorded_null_threshold() if dataset.version == "2.0" else None
    null_threshold, source = choose_null_threshold(dataset.version, args.null_threshold,
                                                   recorded)
    if dataset.version != "2.0" and args.null_threshold is not None:
        log.warning("--null-threshold is not used: %s is a SQuAD v1.1 file (every question has "
                    "an answer)", args.data)
    if null_threshold is not None:
        log.info("null threshold %g (%s)", null_threshold, source)
    reader = load_requested(request)
    reader = with_lsh_flags(reader, args, checkpoint.name)
    prescreen = prescreen_from_args(args)
    started = time.perf_counter()
    report: dict = {}
    predictions = predict_squad(
        reader, examples, max_passage_len=max_passage_len, doc_stride=doc_stride,
        batch_size=args.batch_size, max_answer_length=args.max_answer_length,
        n_best=args.n_best, null_threshold=null_threshold, progress=not args.no_progress,
        cache_dir=args.cache_dir, prescreen=prescreen, report=report)
    output = write_atomic(args.output, json.dumps(predictions, ensure_ascii=False, indent=1))
    log.info("%d predictions (%s) in %.1f s -> %s", len(predictions), reader.describe(),
             time.perf_counter() - started, output)
    if prescreen is not None:
        log.info("prescreening (%s) kept %.0f%% of the passage tokens (%.1f s); reading %.1f s",
                 prescreen[1], 100 * report["kept_token_share"], report["prescreen_seconds"],
                 report["read_seconds"])
    return 0
