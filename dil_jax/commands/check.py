"""`dil-jax check`: import a checkpoint, check parity with Hugging Face, read a small grid.

1. Imports the checkpoint (default: the embedded MiniLM) and prints the import report.
2. With torch installed, runs Hugging Face's `AutoModelForQuestionAnswering` on the same
   `[CLS] q [SEP] p [SEP]` inputs (the tokenizer's pair layout: RoBERTa `<s> q </s></s> p </s>`,
   XLNet `p [SEP] q [SEP] [CLS]`) and prints the max abs logit difference of our full model
   (k = 0), in float32 on both sides: bfloat16 weights (the bundled readers') are upcast
   exactly, as dil_jax's load does, so the tolerance is float32's (`parity_tolerance`). A
   reader that leaves tensors to a base (the bundled readers' word embeddings) is given to
   transformers as its complete export (`dil-jax export --format hf`), written to a temporary
   folder; a backbone tensor transformers had to initialise is a MISMATCH.
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


# Two float32 implementations of one forward (XLA's and torch's) differ by rounding only: each
# op errs by float32's epsilon relative to its values, and a logit sums l blocks of dot products
# over up to ~1,500 terms, whose rounding errors add up like a random walk (sqrt(1536) ~ 40 eps
# per sum). 2**10 eps of the logits' magnitude (1.2e-4 at |logit| <= 1, the tolerance this check
# had) leaves that room on any CPU, and stays far below what a wrong or random tensor moves a
# logit by (O(1)). Measured on the bundled full reader's export: 5.5e-6 to 7.6e-6 at |logit|
# ~ 7.5 on five dev questions (6-9 eps of it; the machine: 4.8e-6).
PARITY_EPS_MULTIPLE = 2 ** 10


def parity_tolerance(reference) -> float:
    """The largest |logit difference| two float32 implementations of the same forward may show
    on logits `reference` (an array): PARITY_EPS_MULTIPLE float32 epsilons of their magnitude
    (at least 1)."""
    import numpy as np

    scale = max(1.0, float(np.max(np.abs(reference))))
    return PARITY_EPS_MULTIPLE * float(np.finfo(np.float32).eps) * scale


def _transformers_source(folder, config, params, staging) -> str:
    """The folder transformers loads for the parity check: the checkpoint's own, or, when its
    manifest leaves tensors to a base (which transformers would fill at random, or refuse),
    its complete float32 export written under `staging`."""
    from dil_jax.checkpoints import ExportManifest, export_hf_checkpoint

    if not ExportManifest.read(folder).from_base:
        return str(folder)
    return str(export_hf_checkpoint(staging / "complete", params, config))


def _hf_parity(folder, config, params, q, p) -> tuple[dict | None, str]:
    """Returns (HF-converted params sharing the torch QA head, message). `params`: ours, as
    loaded (written out for transformers when the folder is not complete)."""
    try:
        import torch
        from transformers import AutoModelForQuestionAnswering
    except ImportError:
        return None, "parity vs Hugging Face: not checked (torch not installed; pip install " \
                     "'dil_jax[torch]')"
    import tempfile
    from pathlib import Path

    import numpy as np
    from transformers.utils import logging as hf_logging

    from dil_jax.checkpoints import convert_state_dict
    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.xlnet import xlnet_input_order

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="dil-jax-check-") as staging:
        source = _transformers_source(folder, config, params, Path(staging))
        # float32 whatever the file stores: transformers would otherwise keep bfloat16 weights
        # in bfloat16 (and numpy has no bfloat16), where dil_jax computes in float32.
        hf_model, info = AutoModelForQuestionAnswering.from_pretrained(
            source, dtype=torch.float32, output_loading_info=True)
    hf_model.eval()
    # A backbone tensor transformers initialised would be shared with ours below and pass
    # unseen: the check fails on it (a missing QA head is fine, both share torch's).
    at_random = [name for name in info["missing_keys"] if "qa_outputs" not in name]
    state = {name: t.detach().numpy() for name, t in hf_model.state_dict().items()}
    full = config.replace(num_lower_layers=0)  # transformers' model is the full one
    params, _ = convert_state_dict(state, full)
    ours = DelayedInteractionModel(full)(params, q.ids, q.mask, p.ids, p.mask)
    worst, tolerance, within = 0.0, 0.0, True
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
            reference = theirs[0, passage].numpy()
            diff = np.abs(np.asarray(mine[row, :len(p_ids)]) - reference)
            # Each pair against its own logits' magnitude: one with large logits must not
            # lend its room to another's.
            within = within and float(diff.max()) <= parity_tolerance(reference)
            worst = max(worst, float(diff.max()))
            tolerance = max(tolerance, parity_tolerance(reference))
    verdict = "OK" if within and not at_random else "MISMATCH"
    note = (f"; transformers initialised {', '.join(at_random)} at random" if at_random else "")
    via = "" if source == str(folder) else ", read from its complete float32 export"
    return params, (f"parity vs Hugging Face {type(hf_model).__name__} (torch {torch.__version__}"
                    f"{via}), {len(q)} pairs at k = 0: max |start/end logit diff| = {worst:.2e} "
                    f"(tolerance {tolerance:.1e}, float32) [{verdict}]{note}")


def run(args: argparse.Namespace) -> int:
    """Steps 1-3 of the module docstring; exit status 1 when the grid differs from the direct
    forward or the Hugging Face parity check fails, else 0."""
    from dil_jax.checkpoints import load_hf_checkpoint, resolve_checkpoint
    from dil_jax.model.encoder_config import ReaderOverrides
    from dil_jax.samples import SAMPLE_PASSAGES, SAMPLE_QUESTIONS
    from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer

    folder = resolve_checkpoint(args.checkpoint)
    config, params, report = load_hf_checkpoint(
        folder, ReaderOverrides(max_question_len=args.max_question_len))
    print(report.summary())
    ks = _split_points(args.k, config.num_layers)
    tokenizer = load_tokenizer(folder, vocab_size=config.vocab_size,
                               architecture=config.architecture)
    q = encode_questions(tokenizer, SAMPLE_QUESTIONS, args.max_question_len)
    p = encode_passages(tokenizer, SAMPLE_PASSAGES, args.max_passage_len)
    _print_setup(config, q, p, args)

    n = min(len(q), len(p))
    hf_params, message = _hf_parity(folder, config, params, _take(q, n), _take(p, n))
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
