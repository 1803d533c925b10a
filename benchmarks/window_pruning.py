"""Window pruning measured: every pair's exact scores and cheap features, then rules simulated.

    # 1. read every (question, window) pair of the top-p passages exactly, once, and record per
    #    pair its best span (text, scores), its BM25 score and rank, and the cheap features a
    #    pruning rule may use (resumable: one file per block of questions)
    python benchmarks/window_pruning.py collect --index INDEX --k 4 \\
        --data ../shared/data/squad/dev-v1.1.35-articles.json --articles 25:28 --out DIR
    # 2. every rule of `--rules` applied to those pairs: pairs read, recall of the window the
    #    exact read picks, EM / F1 without and with the IR score against the exact read's;
    #    with --target, per setting the stop1~H of the sweep reading fewest pairs at that recall
    python benchmarks/window_pruning.py simulate --pairs DIR --out OUT --target 99.5 \\
        --rules all stop1 stop1~4 stop1~4.5 stop1~5 ... bm25:8 mix0.5:8 lower:8 embed:8
    # 3. record the calibrated H of a reader in its manifest (what `serve` and
    #    `--prune-windows calibrated` read: `PruningCalibration`), the values as simulate
    #    chose them, for the rule, fusion weight and depth they were calibrated at
    python benchmarks/window_pruning.py record --reader dil_jax/assets/minilm-squad-k4 \\
        --high logits=4.75 --high margin=7 --recall logits=0.9966 --recall margin=0.9966 \\
        --mu 0.5 --top-p 29 --calibrated-on "593 questions of dev articles 25-27, ..."

The simulation is exact for the rules it applies, not a model of them: a pruned read reads a
subset of the same pairs, and a pair's scores do not depend on which other pairs are read (pairs
are independent rows of the pair program; only float rounding of the chunk they land in
differs), so the answer of a pruned read is the answer the full read's pairs give when only the
kept ones are candidates. `odqa-eval --prune-windows` reads for real and is compared with it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 64


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from dil_jax.commands.arguments import positive_int

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    collect = commands.add_parser("collect", help="read every pair exactly, record it")
    collect.add_argument("--index", required=True)
    collect.add_argument("--k", type=int, required=True)
    collect.add_argument("--checkpoint", default=None,
                         help="default: the bundled reader of k (full for 0, delayed else)")
    collect.add_argument("--data", required=True)
    collect.add_argument("--articles", default=":")
    collect.add_argument("--limit", type=positive_int, default=None)
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--top-p", type=positive_int, default=29)
    collect.add_argument("--batch-size", type=positive_int, default=8)
    collect.add_argument("--max-question-len", type=positive_int, default=32)
    collect.add_argument("--out", required=True)
    simulate = commands.add_parser("simulate", help="apply pruning rules to collected pairs")
    simulate.add_argument("--pairs", required=True, nargs="+", help="collect's --out folder(s)")
    simulate.add_argument("--rules", nargs="+", default=["all"])
    simulate.add_argument("--mu", type=float, default=0.5)
    simulate.add_argument("--batch-size", type=positive_int, default=8,
                          help="questions read together (the stop's rounds are a batch's)")
    simulate.add_argument("--chunk-size", type=positive_int, default=8,
                          help="pairs a chunk of the pair program (a round reads about one)")
    simulate.add_argument("--target", type=float, default=None,
                          help="calibrate: per setting, the stop:H rule of --rules (H swept "
                               "there) reading the fewest pairs whose recall of the exact "
                               "pick's window is at least this percentage")
    simulate.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    record = commands.add_parser("record", help="write a reader's calibrated stop:H into its "
                                                "manifest (the 'window_pruning' record)")
    record.add_argument("--reader", required=True, help="reader folder (dil_jax_manifest.json)")
    record.add_argument("--high", type=rule_value, action="append", required=True,
                        metavar="RULE=H", help="a span score rule's calibrated H (repeat)")
    record.add_argument("--recall", type=rule_value, action="append", default=[],
                        metavar="RULE=FRACTION",
                        help="the recall of the exact pick's window at that H (0..1)")
    record.add_argument("--mu", type=float, required=True,
                        help="the fusion weight it was calibrated at")
    record.add_argument("--top-p", type=positive_int, required=True,
                        help="the depth it was calibrated at")
    record.add_argument("--calibrated-on", required=True,
                        help="what it was calibrated on (questions, index, command)")
    return parser.parse_args(argv)


def rule_value(text: str) -> tuple[str, float]:
    """RULE=VALUE of --high / --recall: a span score rule and a finite number."""
    from dil_jax.defaults import SPAN_SCORES

    rule, _, value = text.partition("=")
    if rule not in SPAN_SCORES:
        raise argparse.ArgumentTypeError(f"{text!r}: RULE=VALUE with RULE one of "
                                         f"{list(SPAN_SCORES)}")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: VALUE must be a number") from None
    if not np.isfinite(number):
        raise argparse.ArgumentTypeError(f"{text!r}: VALUE must be finite")
    return rule, number


rule_value.__name__ = "RULE=VALUE"


# ----------------------------------------------------------------------------- collect


def _examples(args: argparse.Namespace):
    from dil_jax.data.squad import load_squad, select_articles

    examples = [e for e in select_articles(load_squad(args.data).examples, args.articles)
                if e.answer_texts]
    if args.limit is not None and args.limit < len(examples):
        chosen = np.random.default_rng(args.seed).choice(len(examples), args.limit,
                                                         replace=False)
        examples = [examples[i] for i in sorted(chosen)]
    return examples


def _open_reader(args: argparse.Namespace):
    from dil_jax.defaults import bundled_reader
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers import load_reader

    index = open_index(args.index)
    checkpoint = args.checkpoint or bundled_reader("full" if args.k == 0 else "delayed", args.k)
    reader = load_reader(checkpoint, k=args.k, max_question_len=args.max_question_len)
    cache = index.open_cache(reader, None)
    return OpenDomainReader(index, reader, cache, top_p=args.top_p, batch_size=args.batch_size)


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """vectors [..., hidden] float -> the same scaled to unit L2 norm (zero rows stay zero)."""
    vectors = np.asarray(vectors, np.float32)
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norm, out=np.zeros_like(vectors), where=norm > 0)


def token_max_similarity(q_vectors: np.ndarray, q_mask: np.ndarray, p_vectors: np.ndarray,
                         p_mask: np.ndarray, pair_question: np.ndarray, pair_window: np.ndarray,
                         chunk: int = 64) -> np.ndarray:
    """[n_pairs, q_len] float32: for each pair and each question token, its largest cosine
    similarity with any real token of the pair's window (ColBERT's MaxSim); 0 at the question's
    padding, and for a window with no real token.

    q_vectors [nq, q_len, hidden], q_mask [nq, q_len]; p_vectors [n_windows, p_len, hidden],
    p_mask [n_windows, p_len]; pair_question, pair_window [n_pairs] index them. Pairs are taken
    `chunk` at a time, so memory is chunk x q_len x p_len, not the whole list's.
    """
    q_unit, p_unit = unit_rows(q_vectors), unit_rows(p_vectors)
    q_real, p_real = np.asarray(q_mask) != 0, np.asarray(p_mask) != 0
    pair_question, pair_window = np.asarray(pair_question), np.asarray(pair_window)
    out = np.zeros((len(pair_question), q_unit.shape[1]), np.float32)
    for lo in range(0, len(pair_question), chunk):
        qi, wi = pair_question[lo:lo + chunk], pair_window[lo:lo + chunk]
        sims = np.einsum("cqh,cph->cqp", q_unit[qi], p_unit[wi])    # [c, q_len, p_len]
        sims = np.where(p_real[wi][:, None, :], sims, -np.inf).max(axis=2)
        out[lo:lo + chunk] = np.where(q_real[qi] & np.isfinite(sims), sims, 0.0)
    return out


def _word_vectors(reader, ids: np.ndarray) -> np.ndarray:
    """[..., hidden] the reader's word embeddings of token ids [...] (no positions, no
    segment: a static vector per token)."""
    table = np.asarray(reader.reader.params["embeddings"]["word_embeddings"]["embedding"])
    return table[np.asarray(ids)]


def collect_batch(reader, questions: list[str]) -> dict[str, Any]:
    """Every pair of a batch of questions, read exactly, with its features."""
    from dil_jax.data.decoding import window_nbest
    from dil_jax.open_domain.reader import RetrievedPairs
    from dil_jax.tokenization import encode_questions

    index, cache = reader.index, reader.cache
    hits = reader.retrieve(questions)
    q_lower, q_mask = reader._encode_question_batch(questions)
    pairs = RetrievedPairs.of_hits(index.windows, hits)
    pair_rows = np.asarray(pairs.row, np.int64)
    rows, pair_window = np.unique(pair_rows, return_inverse=True)
    pair_window = pair_window.reshape(-1)
    pair_question = np.asarray(pairs.question, np.int64)
    started = time.perf_counter()
    scores, _ = reader._read_pairs(q_lower, q_mask, pairs, None)
    pair_seconds = time.perf_counter() - started
    offsets = np.asarray(reader.offsets[rows])
    valid_end = offsets[..., 0] >= 0
    valid_start = valid_end & np.asarray(reader.max_context[rows])
    span, starts, ends = window_nbest(scores.start_logits, scores.end_logits,
                                      valid_start[pair_window], valid_end[pair_window], n_best=1,
                                      max_answer_length=reader.max_answer_length)
    p_mask = np.asarray(cache.mask[rows])
    ids = np.asarray(cache.ids[rows])
    q = encode_questions(reader.reader.tokenizer, questions,
                         reader.reader.config.max_question_len)
    q_ids, q_real = q.ids, q.mask
    embed_sim = token_max_similarity(_word_vectors(reader, q_ids), q_real,
                                     _word_vectors(reader, ids), p_mask, pair_question,
                                     pair_window)
    lower_sim = None
    if cache.states is not None:
        states = cache.read_states(rows)
        lower_sim = token_max_similarity(np.asarray(q_lower)[:len(questions)], q_real, states,
                                         p_mask, pair_question, pair_window)
    texts, windows_of_passage, window_number = [], [], []
    for pair, row in enumerate(pair_rows):
        qi, hi = pairs.hit[pair]
        passage_index = hits[qi][hi].passage_index
        first = int(index.windows.first[passage_index])
        windows_of_passage.append(int(index.windows.count[passage_index]))
        window_number.append(int(row) - first)
        if starts[pair, 0] < 0:
            texts.append("")
            continue
        text = index.passages[passage_index].text
        w = pair_window[pair]
        texts.append(text[int(offsets[w, starts[pair, 0], 0]):int(offsets[w, ends[pair, 0], 1])])
    return dict(
        question=pair_question, rank=np.asarray([h for _, h in pairs.hit]),
        row=pair_rows, bm25=np.asarray([hits[qi][hi].score for qi, hi in pairs.hit]),
        passage=np.asarray([hits[qi][hi].passage_index for qi, hi in pairs.hit]),
        window_number=np.asarray(window_number), windows_of_passage=np.asarray(windows_of_passage),
        real_tokens=p_mask.sum(axis=1)[pair_window],
        best_span=span[:, 0], null_start=scores.null_start_logits,
        null_end=scores.null_end_logits, embed_sim=embed_sim,
        **({} if lower_sim is None else dict(lower_sim=lower_sim)),
        q_ids=q_ids, q_mask=q_real, texts=texts, pair_seconds=pair_seconds)


def _concat(parts: list[dict[str, Any]], questions_before: list[int]) -> dict[str, Any]:
    """One block from batches: pair arrays concatenated, question numbers made block-wide."""
    out: dict[str, Any] = {}
    for name in parts[0]:
        if name == "pair_seconds":
            out[name] = sum(part[name] for part in parts)
        elif name == "texts":
            out[name] = [text for part in parts for text in part[name]]
        elif name == "question":
            out[name] = np.concatenate([part[name] + before
                                        for part, before in zip(parts, questions_before)])
        else:
            out[name] = np.concatenate([part[name] for part in parts])
    return out


def collect(args: argparse.Namespace) -> None:
    examples = _examples(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reader = _open_reader(args)
    (out / "meta.json").write_text(json.dumps(dict(
        command=" ".join(["python", *sys.argv]), index=args.index, k=args.k,
        checkpoint=str(reader.reader.checkpoint.name), data=args.data, articles=args.articles,
        top_p=args.top_p, questions=[dict(id=e.qid, question=e.question,
                                          answers=list(e.answer_texts)) for e in examples]),
        indent=1))
    step = args.batch_size
    for start in range(0, len(examples), BLOCK):
        path = out / f"block-{start:05d}.npz"
        if path.exists():
            continue
        block = examples[start:start + BLOCK]
        clock = time.perf_counter()
        parts = [collect_batch(reader, [e.question for e in block[i:i + step]])
                 for i in range(0, len(block), step)]
        data = _concat(parts, list(range(0, len(block), step)))
        data["question"] = data["question"] + start
        texts = data.pop("texts")
        partial = path.with_name(f".{path.name}")
        with partial.open("wb") as handle:
            np.savez(handle, texts=np.asarray(json.dumps(texts)), **data)
        partial.rename(path)
        seconds = time.perf_counter() - clock
        print(f"{start + len(block)}/{len(examples)} questions, block {seconds:.0f} s"
              f" (pair phase {data['pair_seconds']:.0f} s)", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- simulate


def load_pairs(folder: str | Path) -> dict[str, Any]:
    """collect's blocks of one folder joined: pair arrays (question numbers over the folder),
    texts, and meta (its questions with their gold answers)."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    parts, texts = [], []
    for path in sorted(folder.glob("block-*.npz")):
        with np.load(path) as block:
            parts.append({name: block[name] for name in block.files if name != "texts"})
            texts += json.loads(str(block["texts"]))
    q_fields = ("q_ids", "q_mask")
    data = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]
            if name != "pair_seconds"}
    data["pair_seconds"] = sum(float(part["pair_seconds"]) for part in parts)
    data["texts"] = texts
    data["meta"] = meta
    data["num_questions"] = len(data[q_fields[0]])
    return data


def question_pairs(question: np.ndarray) -> list[np.ndarray]:
    """[n_pairs] question number of each pair (grouped, ascending) -> each question's pair
    indices."""
    bounds = np.flatnonzero(np.diff(question)) + 1
    return np.split(np.arange(len(question)), bounds)


def rule_score(data: dict[str, Any], rule: str) -> np.ndarray:
    """[n_pairs] each pair's score under a span score rule (`pair_span_scores`), float64."""
    from dil_jax.open_domain.scoring import pair_span_scores
    from dil_jax.reading.pairs import SpanScores

    scores = SpanScores(None, None, data["null_start"], data["null_end"])
    return np.asarray(pair_span_scores(np.asarray(data["best_span"], np.float64), scores, rule),
                      np.float64)


def picked_pair(data: dict[str, Any], pairs: np.ndarray, scores: np.ndarray,
                mu: float | None) -> int | None:
    """The pair whose span the reader answers with when only `pairs` (one question's, in
    retrieval order) are read: each hit's best pair, the candidates picked among by
    `pick_answer` (as `OpenDomainReader._candidates` and `pick_answer` do)."""
    from dil_jax.open_domain.scoring import Candidate, best_pair_of_each_hit, pick_answer

    if not len(pairs):
        return None
    hits = [(0, int(rank)) for rank in data["rank"][pairs]]
    best = best_pair_of_each_hit(scores[pairs], hits)
    candidates = []
    for position in sorted(best.values()):
        pair = int(pairs[position])
        if np.isfinite(data["best_span"][pair]):
            candidates.append(Candidate(pair, int(data["rank"][pair]), "", 0, 0,
                                        float(scores[pair]) / 2, float(data["bm25"][pair])))
    answer = pick_answer(candidates, mu)
    return None if answer is None else answer.passage_index


def content_tokens(q_mask: np.ndarray) -> np.ndarray:
    """[nq, q_len] bool: a question's real tokens but its first (`[CLS]`) and last (`[SEP]`):
    every window holds a `[SEP]` too, so the specials would add the same to every window."""
    real = np.asarray(q_mask) != 0
    last = real.sum(axis=1) - 1
    content = real.copy()
    content[:, 0] = False
    content[np.arange(len(real)), last] = False
    return content


def standardized_per_question(values: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """[n_pairs] values standardised over each question's pairs (`standardize`)."""
    from dil_jax.open_domain.scoring import standardize

    out = np.zeros(len(values))
    for pairs in groups:
        out[pairs] = standardize(values[pairs])
    return out


def cheap_score(data: dict[str, Any], name: str, groups: list[np.ndarray]) -> np.ndarray:
    """[n_pairs] a cheap score of each pair, higher = keep first: "bm25" (the passage's, its
    windows in order), "lower" / "embed" (MaxSim summed over the question's content tokens, of
    the lower states / the word embeddings), "mix<a>" / "mixe<a>" (z(bm25) + a z(lower / embed)
    over the question's pairs)."""
    content = content_tokens(data["q_mask"])[data["question"]]
    order = -1e-6 * data["window_number"]  # a passage's windows in order on ties
    if name == "bm25":
        return data["bm25"] + order
    if name in ("lower", "embed"):
        return (data[f"{name}_sim"] * content).sum(axis=1) + order
    for prefix, sim in (("mixe", "embed"), ("mix", "lower")):
        if name.startswith(prefix):
            weight = float(name[len(prefix):])
            maxsim = (data[f"{sim}_sim"] * content).sum(axis=1)
            return (standardized_per_question(data["bm25"], groups)
                    + weight * standardized_per_question(maxsim, groups) + order)
    raise ValueError(f"unknown cheap score {name!r}")


def keep_top(scores: np.ndarray, pairs: np.ndarray, keep: int) -> np.ndarray:
    """The `keep` pairs of one question with the highest cheap scores (earlier pairs first on
    ties), in retrieval order."""
    order = np.argsort(-scores[pairs], kind="stable")[:keep]
    return pairs[np.sort(order)]


def score_bounds(checkpoint: str, k: int) -> dict[str, tuple[float, float]]:
    """rule -> (lowest, highest) reader score of the reader (`span_head_bounds`,
    `reader_score_bounds`)."""
    from dil_jax.open_domain.pruning import reader_score_bounds, span_head_bounds
    from dil_jax.readers import load_reader

    logit_bounds = span_head_bounds(load_reader(checkpoint, k=k, with_tokenizer=False))
    return {rule: reader_score_bounds(logit_bounds, rule) for rule in ("logits", "margin")}


SETTINGS = [(rule, fused) for rule in ("logits", "margin") for fused in (False, True)]


def batch_stop(data: dict[str, Any], batch: list[np.ndarray], scores: np.ndarray,
               mu: float | None, stage: int, chunk_size: int, bounds: tuple[float, float]
               ) -> list[np.ndarray]:
    """The pairs each question of a batch (its pair indices, in retrieval order) reads under
    the early stop, round by round as `OpenDomainReader._read_until_settled` reads them: the
    same schedule (`round_depths`) and settle test (`settled_questions`), on these pairs'
    scores (`scores`: the rule's, [n_pairs])."""
    from dil_jax.open_domain.pruning import settled_questions
    from dil_jax.open_domain.reader import passage_windows, round_depths

    pairs = np.concatenate(batch)
    question = np.concatenate([np.full(len(p), q) for q, p in enumerate(batch)])
    rank, bm25 = data["rank"][pairs], data["bm25"][pairs]
    reader = np.where(np.isfinite(data["best_span"][pairs]), scores[pairs] / 2, -np.inf)
    read = np.zeros(len(pairs), bool)
    windows = passage_windows(question, rank)
    depth = np.zeros(len(batch), np.int64)
    unsettled = [q for q, p in enumerate(batch) if len(p)]
    while unsettled:
        depth = round_depths(depth, unsettled, windows, stage, chunk_size)
        read |= np.isin(question, unsettled) & (rank < depth[question])
        settled = set(settled_questions(question, rank, reader, bm25, read, bounds, mu,
                                        unsettled))
        unsettled = [q for q in unsettled if q not in settled and (~read[question == q]).any()]
    return [pairs[(question == q) & read] for q in range(len(batch))]


def kept_pairs(data: dict[str, Any], rule_text: str, groups: list[np.ndarray],
               scores: np.ndarray, mu: float | None, r_bounds: tuple[float, float],
               batch_size: int = 8, chunk_size: int = 8) -> list[np.ndarray]:
    """Each question's pairs read under a pruning rule: "all", "<cheap score>:<N>" (the N
    best by `cheap_score`), "stop<S>[~<H>]" (`batch_stop` with stage S, in batches of
    `batch_size` questions, chunks of `chunk_size` pairs; with H the highest reader score an
    unread passage is assumed to have: no longer a bound, an approximation)."""
    if rule_text == "all":
        return groups
    if rule_text.startswith("stop"):
        text, _, high = rule_text.partition("~")
        bounds = r_bounds if not high else (r_bounds[0], float(high))
        return [kept for lo in range(0, len(groups), batch_size)
                for kept in batch_stop(data, groups[lo:lo + batch_size], scores, mu,
                                       int(text[4:]), chunk_size, bounds)]
    name, keep = rule_text.rsplit(":", 1)
    cheap = cheap_score(data, name, groups)
    return [keep_top(cheap, pairs, int(keep)) for pairs in groups]


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    from dil_jax.metrics.squad_metric import exact_score, f1_score_v1

    records = []
    for folder in args.pairs:
        data = load_pairs(folder)
        golds = [q["answers"] for q in data["meta"]["questions"]]
        groups = question_pairs(data["question"])
        bounds = score_bounds(data["meta"]["checkpoint"], data["meta"]["k"])
        print(f"{folder}: {len(groups)} questions, {len(data['question'])} pairs; reader score "
              f"bounds {bounds}", file=sys.stderr)
        exact_picks = {}
        for rule, fused in SETTINGS:
            scores = rule_score(data, rule)
            mu = args.mu if fused else None
            exact_picks[rule, fused] = [picked_pair(data, pairs, scores, mu) for pairs in groups]
        for rule_text in args.rules:
            row: dict[str, Any] = dict(pairs=str(folder), rule=rule_text, settings={})
            for rule, fused in SETTINGS:
                scores = rule_score(data, rule)
                mu = args.mu if fused else None
                kept = kept_pairs(data, rule_text, groups, scores, mu, bounds[rule],
                                  args.batch_size, args.chunk_size)
                picks = [picked_pair(data, pairs, scores, mu) for pairs in kept]
                exact = exact_picks[rule, fused]
                em = f1 = same = recall = 0.0
                for q, (pick, truth, pairs) in enumerate(zip(picks, exact, kept)):
                    text = "" if pick is None else data["texts"][pick]
                    em += max(exact_score(text, g) for g in golds[q])
                    f1 += max(f1_score_v1(text, g) for g in golds[q])
                    same += (pick == truth)
                    recall += truth is None or truth in set(pairs.tolist())
                n = len(groups)
                read = np.concatenate(kept) if kept else np.zeros(0, int)
                row["settings"][f"{rule}{' +IR' if fused else ''}"] = dict(
                    pairs_per_question=len(read) / n,
                    tokens_per_pair=float(data["real_tokens"][read].mean()) if len(read) else 0,
                    recall=100 * recall / n, same=100 * same / n, EM=100 * em / n,
                    F1=100 * f1 / n)
            records.append(row)
            brief = "; ".join(f"{name}: {v['pairs_per_question']:.1f} p, R {v['recall']:.1f}, "
                              f"= {v['same']:.1f}, EM {v['EM']:.1f}"
                              for name, v in row["settings"].items())
            print(f"{rule_text:>12}  {brief}", file=sys.stderr, flush=True)
    result = dict(command=" ".join(["python", *sys.argv]), mu=args.mu, rows=records)
    text = markdown(records)
    if args.target is not None:
        result["calibrated"] = calibrated(records, args.target)
        text += f"\nCalibrated (recall >= {args.target}%):\n\n" + markdown(result["calibrated"])
        print(text, file=sys.stderr)
    if args.out:
        from dil_jax.atomic import write_atomic

        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out.with_suffix(".json"), json.dumps(result, indent=1))
        write_atomic(out.with_suffix(".md"), f"`{result['command']}`\n\n" + text)
    return result


def calibrated(records: list[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """Per pairs folder, stop rule (its text before "~H") and setting: the row of the swept H
    reading the fewest pairs with recall >= target (as rows of one setting each)."""
    best: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in records:
        if "~" not in row["rule"]:
            continue
        family = row["rule"].split("~")[0]
        for name, values in row["settings"].items():
            key = (row["pairs"], family, name)
            if values["recall"] >= target and (
                    key not in best
                    or values["pairs_per_question"] < best[key]["pairs_per_question"]):
                best[key] = dict(values, rule=row["rule"])
    return [dict(pairs=pairs, rule=values.pop("rule"), settings={name: values})
            for (pairs, _, name), values in sorted(best.items())]


def markdown(records: list[dict[str, Any]]) -> str:
    """One row per (pairs, rule, setting): pairs read, tokens a pair, recall of the exact
    read's pick, same answer, EM / F1."""
    lines = ["| questions | rule | span score | pairs / question | window tokens / pair | "
             "recall of the exact pick's window | same answer | EM | F1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in records:
        for name, v in row["settings"].items():
            lines.append(f"| {Path(row['pairs']).name} | {row['rule']} | {name} | "
                         f"{v['pairs_per_question']:.2f} | {v['tokens_per_pair']:.1f} | "
                         f"{v['recall']:.1f}% | {v['same']:.1f}% | {v['EM']:.1f} | "
                         f"{v['F1']:.1f} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- record


def record(args: argparse.Namespace) -> None:
    """Adds (or replaces) the reader manifest's `window_pruning` record, written atomically,
    after checking it reads back (`PruningCalibration.from_manifest`); the manifest is left
    untouched when it would not."""
    import dataclasses

    from dil_jax.atomic import write_atomic
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest
    from dil_jax.errors import CheckpointError
    from dil_jax.open_domain.pruning import MANIFEST_KEY, PruningCalibration

    folder = Path(args.reader)
    if not (folder / MANIFEST_FILE).is_file():
        raise SystemExit(f"window_pruning: --reader {folder}: no {MANIFEST_FILE} there (the "
                         "calibration is recorded in a reader folder's manifest)")
    calibration = PruningCalibration(dict(args.high), args.mu, args.top_p, args.calibrated_on,
                                     dict(args.recall))
    manifest = ExportManifest.read(folder)
    # In the order `ExportManifest.to_json` writes: a later rewrite then moves nothing.
    written = dataclasses.replace(manifest, records={**manifest.records,
                                                     MANIFEST_KEY: calibration.to_json()})
    try:
        PruningCalibration.from_manifest(written.to_json(), folder / MANIFEST_FILE)
    except CheckpointError as error:
        raise SystemExit(f"window_pruning: not recorded: {error}") from None
    write_atomic(folder / MANIFEST_FILE, json.dumps(written.to_json(), indent=2) + "\n")
    print(f"recorded {MANIFEST_KEY} in {folder / MANIFEST_FILE}: "
          f"{json.dumps(calibration.to_json())}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    {"collect": collect, "simulate": simulate, "record": record}[args.command](args)


if __name__ == "__main__":
    main()
