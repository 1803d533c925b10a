"""OpenSQuAD-style evaluation, as in the DilBert paper.

For each reader (the full model and delayed interaction at some k) and each p (29 and 100):
  R   share of questions for which a gold answer string appears in one of the top-p passages
      (after SQuAD answer normalisation), a property of retrieval alone;
  EM, F1  of the reader's answer over the top-p passages, without the IR score (reader score
      alone) and with it (score fusion, see dil_jax.open_domain.reader), for each span score
      rule (`SPAN_SCORES`: "logits", the paper's, and "margin", over the window's no-answer).
The top-p of a smaller p is a prefix of the larger one's, so each reader reads max(p) passages
per question once and every p and every rule is scored from that read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from dil_jax.data.squad import SquadExample
from dil_jax.metrics.squad_metric import exact_score, f1_score_v1, normalize_answer
from dil_jax.open_domain.reader import Candidate, OpenDomainReader, pick_answer


def recall_at_p(example: SquadExample, passage_texts: Sequence[str]) -> bool:
    """Does a normalised gold answer occur in a normalised retrieved passage?"""
    golds = [normalize_answer(text) for text in example.answer_texts]
    golds = [gold for gold in golds if gold]
    passages = [normalize_answer(text) for text in passage_texts]
    return any(gold in passage for gold in golds for passage in passages)


def _best_over_golds(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    return (max(exact_score(prediction, gold) for gold in golds),
            max(f1_score_v1(prediction, gold) for gold in golds))


def evaluate_reader(reader: OpenDomainReader, examples: Sequence[SquadExample],
                    p_values: Sequence[int] = (29, 100), mu: float = 0.5) -> dict[str, Any]:
    """Scores of one reader; `examples` must be answerable (SQuAD 1.1 style).

    by_p: p -> R and EM/F1 (without / with IR) under the reader's own span score rule;
    by_score: rule -> p -> the same, for every rule of the one read (R is the same for all).
    `unmatched` counts the questions that share no word with any passage (no BM25 hit): they
    are scored as unanswered (empty prediction), not errors.
    """
    reader.top_p = max(p_values)
    started = time.perf_counter()
    result = reader.read([example.question for example in examples])
    wall = time.perf_counter() - started
    recalls = {p: 100 * sum(recall_at_p(example, [reader.index.passages[h.passage_index].text
                                                  for h in hits[:p]])
                            for example, hits in zip(examples, result.hits, strict=True))
               / len(examples) for p in p_values}
    by_score = {rule: {p: dict(R=recalls[p], **_answer_scores(examples, candidates, p, mu))
                       for p in sorted(p_values)}
                for rule, candidates in result.by_score.items()}
    # A question no passage shares a word with gets no hits: it counts as unanswered ("").
    unmatched = sum(not hits for hits in result.hits)
    return dict(k=reader.model.config.num_lower_layers, l=reader.model.config.num_layers,
                questions=len(examples), unmatched=unmatched, mu=mu, wall_seconds=wall,
                timings=result.timings, span_score=reader.span_score,
                by_p=by_score[reader.span_score], by_score=by_score)


def _answer_scores(examples: Sequence[SquadExample], candidates: Sequence[Sequence[Candidate]],
                   p: int, mu: float) -> dict[str, float]:
    """EM/F1 (percent) of the answers among each question's top-p candidates, without the IR
    score (EM, F1) and fused with it at mu (EM_ir, F1_ir)."""
    totals = dict(EM=0.0, F1=0.0, EM_ir=0.0, F1_ir=0.0)
    for example, question_candidates in zip(examples, candidates, strict=True):
        top = [c for c in question_candidates if c.rank < p]
        for suffix, mu_value in (("", None), ("_ir", mu)):
            answer = pick_answer(top, mu_value)
            em, f1 = _best_over_golds(answer.text if answer else "", example.answer_texts)
            totals["EM" + suffix] += em
            totals["F1" + suffix] += f1
    return {name: 100 * total / len(examples) for name, total in totals.items()}


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    """One row per (reader, p, span score rule): R, EM/F1 without and with the IR score,
    reader time (one read serves every rule)."""
    lines = ["| reader | k/l | p | span score | R | EM | F1 | EM (+IR) | F1 (+IR) | pair-upper s "
             "| total s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        for p in result["by_p"]:
            for rule, rows in result["by_score"].items():
                row = rows[p]
                lines.append(
                    f"| {name} | {result['k']}/{result['l']} | {p} | {rule} | {row['R']:.1f} | "
                    f"{row['EM']:.1f} | {row['F1']:.1f} | {row['EM_ir']:.1f} | "
                    f"{row['F1_ir']:.1f} | {result['timings']['pair_upper']:.1f} | "
                    f"{result['wall_seconds']:.1f} |")
    return "\n".join(lines)


def dump_json(results: dict[str, dict[str, Any]], extra: dict[str, Any]) -> str:
    return json.dumps({"results": results, **extra}, indent=2, default=str)
