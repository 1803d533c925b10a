"""`dil-jax prescreen`: train the sentence prescreener, score it, and read with it end to end.

    dil-jax prescreen --config configs/prescreen.py [--config.train.steps=3000 ...]
    dil-jax prescreen --config configs/prescreen.py --prescreener default \\
        --readers dil_jax/assets/minilm-squad-full --top-m 1 2 --mass 0.9

Sentence embeddings come from the config's sentence encoder (default: the embedded
all-MiniLM-L6-v2; mean pooling, normalised), computed once per distinct sentence and cached in
`--config.encoder.cache_dir` as they are computed (a stopped run resumes there). The prescreener
("Prototype 4") trains on the training articles (of `--config.data.file`; by default the complete
SQuAD v1.1 training set), keeps the params that score best on the dev articles (of
`--config.data.eval_file`: early stopping), and is written to `workdir` as a prescreener checkpoint
folder (with results.md). Top-1/top-2 sentence accuracy is reported next to the first-sentence
baseline. With `--prescreener` an existing checkpoint is scored instead of training one. With
`--readers`, each reader answers the first `--eval-limit` validation questions without prescreening
and with each sentence rule, reading only the kept sentences' tokens in the upper blocks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dil_jax.commands.arguments import (
    add_compilation_cache_arguments,
    fraction,
    positive_int,
    window_len,
)
from dil_jax.defaults import CPU_MAX_PASSAGE_LEN, CPU_MAX_QUESTION_LEN
from dil_jax.errors import UsageError


def check_workdir(args: argparse.Namespace, config) -> None:
    """Refuses, before any embedding or training, a workdir this run cannot write or would
    destroy: training replaces it as a whole with the prescreener folder (staged, then renamed
    over), so it must be new, empty or an earlier prescreener, and hold none of the inputs;
    scoring with --readers writes end_to_end.md/.json into it."""
    from dil_jax.atomic import check_output_folder
    from dil_jax.prescreening.prescreener import MANIFEST_FILE

    def local(*paths) -> list[str]:  # 'default' names a bundled file, not one in the cwd
        return [str(path) for path in paths if path and str(path) != "default"]

    inputs = {"--config.data.file": config.data.file,
              "--config.data.eval_file": local(config.data.eval_file),
              "--config.encoder.cache_dir": local(config.encoder.cache_dir),
              "--prescreener": local(args.prescreener),
              "--readers": local(*args.readers),
              "--config.encoder.checkpoint": local(config.encoder.checkpoint)}
    if args.prescreener is None:
        check_output_folder(config.workdir, "--config.workdir", inputs,
                            replaced_unless=MANIFEST_FILE)
        cache = config.encoder.cache_dir
        # Checked even when the workdir is an earlier prescreener, which the check above lets
        # through: replacing it would delete the embeddings the run has just cached.
        if cache and Path(cache).resolve().is_relative_to(Path(config.workdir).resolve()):
            raise UsageError(f"--config.encoder.cache_dir {cache} is inside --config.workdir "
                             f"{config.workdir}, which training replaces as a whole; put the "
                             "cache elsewhere")
    elif args.readers:
        check_output_folder(config.workdir, "--config.workdir", inputs,
                            files=("end_to_end.md", "end_to_end.json"))


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "prescreen", help="train/evaluate the sentence prescreener (SEP)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, metavar="FILE[:ARG]",
                        help="prescreener config (configs/prescreen.py); --config.key=value "
                             "overrides")
    parser.add_argument("--prescreener", default=None,
                        help="score this prescreener ('default' = the bundled one, or a folder) "
                             "instead of training one (default: train one)")
    parser.add_argument("--readers", nargs="*", default=[],
                        help="reader checkpoints to run end to end with and without prescreening "
                             "on the validation questions")
    parser.add_argument("--top-m", type=positive_int, nargs="*", default=[1, 2],
                        help="end-to-end rules: keep the m best sentences")
    parser.add_argument("--mass", type=fraction, nargs="*", default=[],
                        help="end-to-end rules: keep the fewest best sentences with this much "
                             "probability")
    parser.add_argument("--eval-limit", type=positive_int, default=400,
                        help="validation questions read end to end (the first N)")
    parser.add_argument("--max-passage-len", type=window_len, default=CPU_MAX_PASSAGE_LEN,
                        help="reader window (tokens) with and without prescreening: the "
                             "bundled readers' training window, so they are scored as trained")
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run, accepts_config_overrides=True)


def _splits(config) -> dict:
    """The config's train/dev/validation splits (dil_jax.prescreening.splits), by name."""
    from dil_jax.prescreening.splits import config_splits

    return config_splits(config.data)


def _split_data(config, examples: dict, encoder, max_sentences: int,
                max_sentence_len: int, overlap=None) -> dict:
    """SentenceData of each split's examples, embedded by `encoder` (a Reader), cached in
    config.encoder.cache_dir ('' = not cached), with their word overlaps when `overlap` (a
    `WordOverlap`) is given. A split left with no question is refused."""
    from dil_jax.prescreening.embedding_cache import encoder_cache
    from dil_jax.prescreening.train import build_sentence_data

    folder = config.encoder.cache_dir
    embed = encoder_cache(Path(folder) if folder else None, encoder, max_sentence_len)
    data = {}
    for name, chosen in examples.items():
        data[name] = build_sentence_data(chosen, max_sentences=max_sentences, embed=embed,
                                         overlap=overlap)
        if not len(data[name].label):
            split = _splits(config)[name]
            raise UsageError(f"{split.articles_flag}={split.articles} ({split.file}): no "
                             f"question with an answer in its first {max_sentences} sentences")
    return data


def _train(config, splits, encoder, idf):
    from dil_jax.prescreening.model import PrescreenConfig
    from dil_jax.prescreening.prescreener import SentencePrescreener
    from dil_jax.prescreening.train import train_prescreener

    model_config = PrescreenConfig(
        embedding_dim=splits["train"].question.shape[1], width=config.model.width,
        num_layers=config.model.num_layers, num_heads=config.model.num_heads,
        mlp_dim=config.model.mlp_dim, max_sentences=config.data.max_sentences,
        dropout=config.model.dropout, interaction=config.model.get("interaction", False),
        overlap=idf is not None)
    train = config.train
    result = train_prescreener(
        splits["train"], model_config, steps=train.steps, batch_size=train.batch_size,
        learning_rate=train.learning_rate, weight_decay=train.weight_decay, seed=train.seed,
        dev=splits["dev"], eval_every=train.eval_every)
    prescreener = SentencePrescreener(model_config, result.params, encoder,
                                      config.encoder.checkpoint, config.encoder.max_sentence_len,
                                      idf)
    return prescreener, result


def run(args: argparse.Namespace) -> int:
    """Trains (or loads) a prescreener, prints its sentence accuracy per split, optionally reads
    end to end with it, and writes the results to config.workdir (see the module docstring)."""
    config = _load_config(args)
    check_workdir(args, config)
    prescreener, splits, training, seconds = _obtain_prescreener(args, config)
    report = {name: _accuracy_row(prescreener, data) for name, data in splits.items()}
    lines = _accuracy_lines(report, config, training, seconds)
    print("\n".join(lines))
    if args.readers:
        rows, table = end_to_end(args, config, splits["validation"], prescreener)
        report["end_to_end"] = rows
        lines += ["", table]
    record = dict(report=report, command=" ".join(["dil-jax", *sys.argv[1:]]),
                  config=config.to_dict(), seconds=seconds,
                  dev_top1=training.dev_top1 if training else None,
                  best_step=training.best_step if training else None)
    _write_results(args, config, prescreener, training, lines, record)
    return 0


def _load_config(args: argparse.Namespace):
    """The --config file with its --config.key=value overrides (anything else is refused)."""
    from dil_jax.train.config_files import load_config, split_overrides

    rest, overrides = split_overrides(args.extra_args or [])
    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)} "
                         "(overrides are --config.key=value)")
    config = load_config(args.config, overrides)
    splits = _splits(config)  # every split's file and slice named, before any loading
    if "validation" not in splits and (args.prescreener is not None or args.readers):
        raise UsageError("--config.data.val_articles is '' (no validation split), but "
                         "--prescreener and --readers score on the validation split; give "
                         "its articles, e.g. --config.data.val_articles=28:35")
    return config


def _obtain_prescreener(args: argparse.Namespace, config) -> tuple:
    """(prescreener, {split: SentenceData}, TrainResult or None, {"embeddings": s, "training": s}).

    Without --prescreener: embeds the train/dev/validation splits and trains one. With it:
    loads that one and embeds the validation split only, as it was trained (its encoder,
    sentence count and length).
    """
    from dil_jax.prescreening.overlap import WordOverlap, fit_idf
    from dil_jax.prescreening.prescreener import SentencePrescreener, load_sentence_encoder
    from dil_jax.prescreening.splits import load_split_examples

    started = time.perf_counter()
    # The files and article slices first: a bad one is refused before any model is loaded.
    examples = load_split_examples(_splits(config),
                                   ("validation",) if args.prescreener is not None else None)
    if args.prescreener is not None:
        prescreener = SentencePrescreener.load(args.prescreener)
        splits = _split_data(config, examples, prescreener.encoder,
                             prescreener.config.max_sentences, prescreener.max_sentence_len,
                             prescreener.word_overlap)
        return prescreener, splits, None, dict(embeddings=time.perf_counter() - started,
                                               training=0.0)
    encoder = load_sentence_encoder(config.encoder.checkpoint, config.encoder.max_sentence_len)
    idf = overlap = None
    if config.model.get("overlap", False):
        # The IDF of the training passages only: dev and validation stay unseen.
        idf = fit_idf(encoder.tokenizer, list(dict.fromkeys(
            example.context for example in examples["train"])))
        overlap = WordOverlap(encoder.tokenizer, idf)
    splits = _split_data(config, examples, encoder, config.data.max_sentences,
                         config.encoder.max_sentence_len, overlap)
    embedded = time.perf_counter() - started
    prescreener, training = _train(config, splits, encoder, idf)
    trained = time.perf_counter() - started - embedded
    return prescreener, splits, training, dict(embeddings=embedded, training=trained)


def _accuracy_row(prescreener, data) -> dict:
    """Questions, dropped questions, first-sentence baseline and top-1/top-2 accuracy of a split."""
    from dil_jax.prescreening.train import data_scores, first_sentence_accuracy, topk_accuracy

    return dict(questions=len(data.label), dropped=data.dropped,
                first_sentence=first_sentence_accuracy(data),
                **topk_accuracy(data_scores(prescreener.params, prescreener.config, data),
                                data.label))


def _accuracy_lines(report: dict, config, training, seconds: dict[str, float]) -> list[str]:
    """The markdown table of `report`, and after a training run its times and final loss."""
    lines = ["| split | articles | questions | first sentence | top-1 | top-2 |",
             "|---|---|---|---|---|---|"]
    splits = _splits(config)
    for name, row in report.items():
        lines.append(f"| {name} | {splits[name].describe()} | {row['questions']} | "
                     f"{100 * row['first_sentence']:.1f} | {100 * row['top1']:.1f} | "
                     f"{100 * row['top2']:.1f} |")
    if training is not None:
        lines.append(f"\nembeddings {seconds['embeddings']:.0f} s, training "
                     f"{seconds['training']:.0f} s ({config.train.steps} steps); params of step "
                     f"{training.best_step} (best dev top-1); final train loss "
                     f"{sum(training.losses[-50:]) / len(training.losses[-50:]):.3f}")
    return lines


def _write_results(args: argparse.Namespace, config, prescreener, training, lines: list[str],
                   record: dict) -> None:
    """A trained prescreener: its folder with results.md. A scored one read end to end:
    end_to_end.md/.json in the workdir. A scored one alone: nothing."""
    from dil_jax.atomic import write_atomic

    if training is not None:
        out = prescreener.save(config.workdir, trained=record)
        write_atomic(out / "results.md", "\n".join(lines) + "\n")
        print(f"wrote the prescreener and results.md to {out}", file=sys.stderr)
    elif args.readers:
        out = Path(config.workdir)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "end_to_end.md", "\n".join(lines) + "\n")
        write_atomic(out / "end_to_end.json", json.dumps(record, indent=2, default=str))
        print(f"wrote {out / 'end_to_end.md'} and .json", file=sys.stderr)


def end_to_end(args, config, data, prescreener) -> tuple[list[dict], str]:
    """EM/F1, prescreening time and reader time with and without prescreening, per reader and
    rule, on the first eval_limit validation questions; with a rule also the share of questions
    whose answer sentence was kept (`P_answer_kept`, the seed's P(SEP)) and the EM on those
    (`EM_given_answer_kept`). Records written before name them P_sep and EM_given_sep."""
    import numpy as np

    from dil_jax.data.squad import gold_answers
    from dil_jax.metrics.squad_metric import squad_scores
    from dil_jax.predict import predict_squad
    from dil_jax.prescreening.screen import SentenceRule
    from dil_jax.readers import ReaderRequest, load_requested

    examples = data.examples[:args.eval_limit]
    rules = [None] + [SentenceRule(top_m=m) for m in args.top_m] + \
        [SentenceRule(top_m=None, mass=mass) for mass in args.mass]
    rows = []
    lines = ["| reader | k/l | prescreen | EM | F1 | P(answer kept) | EM given the answer kept | "
             "tokens read | prescreen s | reader s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for checkpoint in args.readers:
        reader = load_requested(ReaderRequest(checkpoint, None, CPU_MAX_QUESTION_LEN,
                                              checkpoint_flag="--readers"))
        k, layers = reader.config.num_lower_layers, reader.config.num_layers
        for rule in rules:
            screen = None if rule is None else (prescreener, rule)
            kwargs = dict(max_passage_len=args.max_passage_len,
                          doc_stride=args.max_passage_len // 2, progress=False, prescreen=screen)
            predict_squad(reader, examples, **kwargs)  # compiles every shape
            report: dict = {}
            answers = predict_squad(reader, examples, report=report, **kwargs)
            scores = squad_scores(gold_answers(examples), answers, version="1.1")
            row = dict(reader=checkpoint, k=k, l=layers, prescreen=str(rule or "none"),
                       EM=scores["exact"], F1=scores["f1"], questions=len(examples),
                       reader_seconds=report["read_seconds"] + report["decode_seconds"],
                       prescreen_seconds=report.get("prescreen_seconds", 0.0),
                       kept_token_share=report.get("kept_token_share", 1.0))
            if rule is not None:
                kept = report["screening"].answer_kept(examples)
                inside = [e for e, keep in zip(examples, kept, strict=True) if keep]
                row["P_answer_kept"] = float(np.mean(kept))
                row["EM_given_answer_kept"] = squad_scores(
                    gold_answers(inside), {e.qid: answers[e.qid] for e in inside},
                    version="1.1")["exact"]
            rows.append(row)
            kept_share = (f"{100 * row['P_answer_kept']:.1f}" if "P_answer_kept" in row
                          else "—")
            given = (f"{row['EM_given_answer_kept']:.1f}" if "EM_given_answer_kept" in row
                     else "—")
            lines.append(f"| {Path(checkpoint).name} | {k}/{layers} | {row['prescreen']} | "
                         f"{row['EM']:.1f} | {row['F1']:.1f} | {kept_share} | {given} | "
                         f"{100 * row['kept_token_share']:.0f}% | "
                         f"{row['prescreen_seconds']:.1f} | {row['reader_seconds']:.1f} |")
            print(lines[-1], flush=True)
    return rows, "\n".join(lines)
