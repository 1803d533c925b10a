"""`POST /v1/answer`'s response from one question's candidates (plain functions, no model).

The worker reads every question at the server's depth (`Limits.max_p` passages): a passage's
candidate (its best span and reader score) does not depend on the other passages read, so a
request for p < max_p gets exactly what a read at depth p gives by keeping the candidates of
its top-p passages (`Candidate.rank < p`) and fusing over those. Questions asking for
different depths are read in one batch that way.

A question read with window pruning (`reads_pruned`) has candidates for the passages it read
only: their top answer is the full read's (exactly, under "stop") for one span score rule,
fusion weight and depth, so only a request asking for exactly that one answer is read so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dil_jax.open_domain.abstention import Abstention
from dil_jax.open_domain.pruning import WindowPruning
from dil_jax.open_domain.scoring import Candidate, answer_scores
from dil_jax.serve.schemas import AnswerRequest, finite

# Phase names of `OpenDomainReader.read`'s timings, as the API reports them ("prune": a pruned
# read's decisions, which passages to read next).
PHASES = {"retrieval": "retrieve", "question_lower": "encode_question",
          "pair_upper": "read_pairs", "decode": "decode", "prune": "prune"}


def reads_pruned(request: AnswerRequest, pruning: WindowPruning | None, span_score: str,
                 max_p: int, mu: float) -> bool:
    """Whether `request` is read by its reader's pruned copy (`pruning`, settled for the
    reader's `span_score` rule at the server's depth `max_p`): only when its answer is the
    one the pruning settles, the top (top_k 1) one fused at the server's `mu` (use_ir) under
    that rule over all max_p passages. Any other request is read unpruned: a pruned read's
    other candidates, another rule's best, the reader-alone best or a shallower depth's best
    may differ from a full read's."""
    return bool(pruning is not None and pruning.mu is not None
                and np.isclose(pruning.mu, mu) and request.use_ir
                and request.span_score == span_score and request.p == max_p
                and request.top_k == 1)


def ranked(candidates: Sequence[Candidate], p: int, top_k: int, mu: float | None
           ) -> list[tuple[Candidate, float]]:
    """The top_k of the candidates from the top-p passages, best first, with the score they
    are ranked by (the reader score alone when mu is None, else the fused score over these
    candidates). The first is `pick_answer(candidates at depth p, mu)`: ties keep retrieval
    order, as its argmax does."""
    kept = [candidate for candidate in candidates if candidate.rank < p]
    if not kept:
        return []
    scores = answer_scores(kept, mu)
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [(kept[i], float(scores[i])) for i in order]


def answer_payload(request: AnswerRequest, candidates: Sequence[Candidate], hits: Sequence,
                   passages: Sequence, mu: float, abstention: Abstention | None,
                   timings_ms: Mapping[str, float], k: int, batch_size: int,
                   match: float | None = None, pruning: str | None = None,
                   pairs_read: int | None = None) -> dict[str, Any]:
    """The JSON of one answered question.

    passages: the index's passages (title, id, text by index); hits: the question's BM25
    hits at the server's depth; match: the question's `retrieval_match` (needed when the
    reader's abstention has a logistic rule: `Abstention.uses_retrieval`). no_answer: the
    best answer is refused by the reader's abstention (its reader score below the calibrated
    threshold, or under a logistic rule its probability of being right below that rule's;
    the best guess is still listed), or there is no candidate. pruning: the label of the
    window pruning the question was read with (None: every window of its passages);
    pairs_read: the (question, window) pairs read for it at the server's depth (a pruned
    read's candidates are its read passages', so its fused score is standardised over those).
    """
    used_mu = mu if request.use_ir else None
    answers = []
    for candidate, score in ranked(candidates, request.p, request.top_k, used_mu):
        passage = passages[candidate.passage_index]
        answers.append({
            "text": candidate.text,
            "start": candidate.char_start,
            "end": candidate.char_end,
            "passage_id": passage.passage_id,
            "title": passage.title,
            "passage": passage.text,
            "bm25_rank": candidate.rank + 1,
            "reader_score": finite(candidate.reader_score),
            "bm25_score": finite(candidate.bm25_score),
            "fused_score": finite(score) if used_mu is not None else None,
        })
    decision = None
    if abstention is not None and answers and answers[0]["reader_score"] is not None:
        decision = abstention.decide(answers[0]["reader_score"], request.span_score,
                                     request.use_ir, match)
    threshold = (None if abstention is None
                 else abstention.threshold(request.span_score, fused=request.use_ir))
    if decision is not None and decision.probability_threshold is not None:
        threshold = None  # the logistic rule decides, not the reader score alone
    if not answers:
        retrieved = min(len(hits), request.p)
        no_answer_reason = ("no passage shares a word with the question" if not retrieved else
                            f"none of the {retrieved} retrieved passages has an allowed span")
    elif decision is not None and decision.refused and decision.probability is not None:
        no_answer_reason = (f"the best answer's probability of being right "
                            f"{decision.probability:.2f} (reader score "
                            f"{decision.reader_score:.2f}, retrieval match "
                            f"{decision.retrieval_match:.2f}) is below this reader's threshold "
                            f"{decision.probability_threshold:.2f}: no answer found in the "
                            "corpus (the best guess is listed)")
    elif decision is not None and decision.refused:
        no_answer_reason = (f"the best answer's reader score {decision.reader_score:.2f} "
                            f"is below this reader's threshold {threshold:.2f}: no answer found "
                            "in the corpus (the best guess is listed)")
    else:
        no_answer_reason = None
    combined = decision is not None and decision.probability is not None
    return {
        "question": request.question,
        "reader": request.reader,
        "k": k,
        "p": request.p,
        "span_score": request.span_score,
        "use_ir": request.use_ir,
        "mu": used_mu,
        "no_answer": no_answer_reason is not None,
        "no_answer_reason": no_answer_reason,
        "threshold": threshold,
        # Under a logistic rule: the numbers that decided (else null).
        "retrieval_match": finite(decision.retrieval_match) if combined else None,
        "probability": finite(decision.probability) if combined else None,
        "probability_threshold": decision.probability_threshold if combined else None,
        # Passages retrieved at depth p (what `ask` reports as "BM25 rank r of N").
        "retrieved": min(len(hits), request.p),
        "answers": answers,
        "pruning": pruning,
        "pairs_read": pairs_read,
        "batch_size": batch_size,
        "timings_ms": dict(timings_ms),
    }


def phase_ms(timings: Mapping[str, float]) -> dict[str, float]:
    """A read's phase seconds -> the API's milliseconds, by the API's phase names."""
    return {PHASES.get(name, name): round(1e3 * seconds, 3) for name, seconds in timings.items()}
