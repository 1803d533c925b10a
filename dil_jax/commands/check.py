"""`dil-jax check`: import a checkpoint, check parity with Hugging Face, read a small grid.

1. Imports the checkpoint (default: the embedded MiniLM) and prints the import report.
2. With torch installed, runs Hugging Face's `AutoModelForQuestionAnswering` on the same
   `[CLS] q [SEP] p [SEP]` inputs (the tokenizer's pair layout: RoBERTa `<s> q </s></s> p </s>`,
   XLNet `p [SEP] q [SEP] [CLS]`) and prints the max abs logit difference of our full model
   (k = 0).
3. Reads every (question, passage) pair of a small sample grid with the full model and with
   delayed interaction at each requested k: lower states once per question and per passage, the
   upper blocks per pair. Prints, per k, that the cached-lower grid equals the direct per-pair
   forward, the share of pairs whose best start token matches the full model's, and timings.

The QA head of a checkpoint without one is freshly initialised, so answers are not meaningful
before fine-tuning; this checks the machinery, not accuracy.
"""

from __future__ import annotations

import argparse
import time

from dil_jax.commands.arguments import (
    add_compilation_cache_arguments,
    option_type,
    positive_int,
    window_len,
)
from dil_jax.defaults import CHECK_MAX_PASSAGE_LEN, CHECK_MAX_QUESTION_LEN
from dil_jax.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help="import a checkpoint, check HF parity, read a small q x p grid",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="default",
                        help="'default' (embedded MiniLM), a Hugging Face folder, or a hub id")
    parser.add_argument("--k", type=option_type("num_lower_layers"), nargs="+", default=None,
                        help="split points to compare with the full model (default: l-2 l-1)")
    parser.add_argument("--max-question-len", type=option_type("max_question_len"),
                        default=CHECK_MAX_QUESTION_LEN,
                        help="tokens of `[CLS] question [SEP]`, padded; longer questions are cut")
    parser.add_argument("--max-passage-len", type=window_len, default=CHECK_MAX_PASSAGE_LEN,
                        help="tokens of `passage [SEP]` per window (shorter than predict's: "
                             "the sample passages are short)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="timed repeats (median)")
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run)


def _timed(fn, repeats: int) -> tuple[object, float, float]:
    """(result, compile+first-run seconds, median seconds of `repeats` further runs)."""
    import jax
    import numpy as np

    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return result, first, float(np.median(times))


def _hf_parity(folder, config, q, p) -> tuple[dict | None, str]:
    """Returns (HF-converted params sharing the torch QA head, message)."""
    try:
        import torch
        from transformers import AutoModelForQuestionAnswering
    except ImportError:
        return None, "parity vs Hugging Face: not checked (torch not installed; pip install " \
                     "'dil_jax[torch]')"
    import numpy as np
    from transformers.utils import logging as hf_logging

    from dil_jax.checkpoints import convert_state_dict
    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.xlnet import xlnet_input_order

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    hf_model = AutoModelForQuestionAnswering.from_pretrained(str(folder)).eval()
    state = {name: t.detach().numpy() for name, t in hf_model.state_dict().items()}
    params, _ = convert_state_dict(state, config)
    ours = DelayedInteractionModel(config)(params, q.ids, q.mask, p.ids, p.mask)
    worst = 0.0
    for row in range(len(q)):
        q_ids = q.ids[row, :q.mask[row].sum()]
        p_ids = p.ids[row, :p.mask[row].sum()]
        if config.architecture == "xlnet":
            # XLNet's own layout, `P [SEP] Q [SEP] [CLS]`: the passage comes first.
            order, types = xlnet_input_order(q_ids, p_ids)
            passage = slice(0, len(p_ids))
        else:
            order = list(np.concatenate([q_ids, p_ids]))
            types = [0] * len(q_ids) + [1] * len(p_ids)
            passage = slice(len(q_ids), len(q_ids) + len(p_ids))
        ids = torch.tensor(np.asarray(order)[None].astype(np.int64))
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        # XLNet: its segment ids; RoBERTa, XLM-R: type 0 throughout (their default).
        if config.segment_token_types or config.architecture == "xlnet":
            kwargs["token_type_ids"] = torch.tensor([types])
        with torch.no_grad():
            out = hf_model(**kwargs)
        for mine, theirs in ((ours.start_logits, out.start_logits),
                             (ours.end_logits, out.end_logits)):
            diff = np.abs(np.asarray(mine[row, :len(p_ids)]) - theirs[0, passage].numpy())
            worst = max(worst, float(diff.max()))
    verdict = "OK" if worst < 1e-4 else "MISMATCH"
    return params, (f"parity vs Hugging Face {type(hf_model).__name__} (torch {torch.__version__}),"
                    f" {len(q)} pairs: max |start/end logit diff| = {worst:.2e} [{verdict}]")


def run(args: argparse.Namespace) -> int:
    """Steps 1-3 of the module docstring; exit status 1 when the grid differs from the direct
    forward or the Hugging Face parity check fails, else 0."""
    from dil_jax.checkpoints import load_hf_checkpoint, resolve_checkpoint
    from dil_jax.samples import SAMPLE_PASSAGES, SAMPLE_QUESTIONS
    from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer

    folder = resolve_checkpoint(args.checkpoint)
    config, params, report = load_hf_checkpoint(folder, max_question_len=args.max_question_len)
    print(report.summary())
    ks = _split_points(args.k, config.num_layers)
    tokenizer = load_tokenizer(folder, vocab_size=config.vocab_size,
                               architecture=config.architecture)
    q = encode_questions(tokenizer, SAMPLE_QUESTIONS, args.max_question_len)
    p = encode_passages(tokenizer, SAMPLE_PASSAGES, args.max_passage_len)
    _print_setup(config, q, p, args)

    n = min(len(q), len(p))
    hf_params, message = _hf_parity(folder, config, _take(q, n), _take(p, n))
    print(message)
    if hf_params is not None:
        params = hf_params  # share the torch QA head so the printed logits are comparable

    results = {k: _read_grid_at(config, params, q, p, k, args.repeats) for k in [0, *ks]}
    _print_results(results, config.num_layers, args.repeats)
    worst = max(result["cache_error"] for result in results.values())
    return 0 if worst < 1e-4 and "MISMATCH" not in message else 1


def _split_points(requested: list[int] | None, num_layers: int) -> list[int]:
    """The k to compare with the full model: `requested`, else l-2 (at least 1) and l-1."""
    l = num_layers  # noqa: E741 (the paper's name)
    ks = requested if requested is not None else [max(l - 2, 1), l - 1]
    too_deep = [k for k in ks if k >= l]
    if too_deep:
        raise UsageError(f"--k {' '.join(map(str, too_deep))}: this checkpoint has l = {l} "
                         f"blocks, so a split point must be in 0..{l - 1}")
    return ks


def _print_setup(config, q, p, args: argparse.Namespace) -> None:
    import jax

    print(f"model: {config.architecture}, l = {config.num_layers} blocks, hidden "
          f"{config.hidden_size}; grid {len(q)} questions x {len(p)} passages = "
          f"{len(q) * len(p)} pairs (question len {args.max_question_len}, passage len "
          f"{args.max_passage_len}); devices: {jax.device_count()} x "
          f"{jax.devices()[0].platform}")


def _read_grid_at(config, params, q, p, k: int, repeats: int) -> dict:
    """Reads the q x p sample grid with split point k, timed per phase, and compares it with a
    direct per-pair forward.

    Returns {"grid": the grid's outputs (start logits [n_q, n_p, Lp]), "times": median seconds
    of (NI Q, NI P, I Q-P), "compile": seconds of the first runs, "cache_error": max |start
    logit| difference from the direct forward}.
    """
    import numpy as np

    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.reading.grid import PairGrid

    model = DelayedInteractionModel(config.replace(num_lower_layers=k))
    reader = PairGrid(model, batch_size=8, chunk_size=8)
    q_lower, q_first, q_time = _timed(
        lambda: reader.encode_questions(params, q.ids, q.mask), repeats)
    # The passage side: token ids at k = 0 (nothing to time), lower states otherwise.
    p_source, p_first, p_time = _timed(
        lambda: reader.passage_side(params, p.ids, p.mask), repeats)
    grid, pair_first, pair_time = _timed(
        lambda: reader.read_grid(params, q_lower, q.mask, p_source, p.mask), repeats)
    direct = model(params, np.repeat(q.ids, len(p), 0), np.repeat(q.mask, len(p), 0),
                   np.tile(p.ids, (len(q), 1)), np.tile(p.mask, (len(q), 1)))
    cache_error = float(np.abs(grid.start_logits.reshape(-1, p.ids.shape[1])
                               - np.asarray(direct.start_logits)).max())
    return dict(grid=grid, times=(q_time, p_time, pair_time),
                compile=q_first + p_first + pair_first, cache_error=cache_error)


def _print_results(results: dict[int, dict], num_layers: int, repeats: int) -> None:
    """One row per k: phase times, speedup over k = 0, l/(l-k), grid vs direct, same best start."""
    l = num_layers  # noqa: E741 (the paper's name)
    full_start = results[0]["grid"].start_logits.argmax(-1)
    full_total = sum(results[0]["times"])
    print(f"\n{'k':>3} {'NI Q ms':>9} {'NI P ms':>9} {'I Q-P ms':>9} {'total ms':>9} "
          f"{'speedup':>8} {'l/(l-k)':>8} {'grid=direct':>12} {'same start':>11}")
    for k, result in results.items():
        q_time, p_time, pair_time = result["times"]
        total = q_time + p_time + pair_time
        same = float((result["grid"].start_logits.argmax(-1) == full_start).mean())
        ideal = l / (l - k) if k < l else float("inf")
        print(f"{k:>3} {q_time * 1e3:>9.2f} {p_time * 1e3:>9.2f} {pair_time * 1e3:>9.2f} "
              f"{total * 1e3:>9.2f} {full_total / total:>8.2f} {ideal:>8.2f} "
              f"{result['cache_error']:>12.1e} {same:>11.0%}")
    print("\ngrid=direct: max |start logit| difference between the cached-lower pair grid and a "
          "direct per-pair forward (should be ~1e-6).\nsame start: pairs whose best start token "
          "equals the full model's (the QA head is not fine-tuned: informative only).\n"
          f"timings: median of {repeats} runs after a warm-up run, on this machine; "
          "see benchmarks/ for the measured speed table.")


def _take(segments, n):
    from dil_jax.tokenization import Segments

    return Segments(segments.ids[:n], segments.mask[:n], segments.offsets[:n])
