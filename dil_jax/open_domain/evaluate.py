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
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dil_jax.atomic import write_atomic
from dil_jax.data.squad import SquadExample
from dil_jax.errors import DilJaxError
from dil_jax.metrics.squad_metric import exact_score, f1_score_v1, normalize_answer
from dil_jax.open_domain.reader import OpenDomainReader
from dil_jax.open_domain.scoring import Candidate, pick_answer

log = logging.getLogger(__name__)


def recall_at_p(example: SquadExample, passage_texts: Sequence[str]) -> bool:
    """Does a normalised gold answer occur in a normalised retrieved passage?"""
    golds = [normalize_answer(text) for text in example.answer_texts]
    golds = [gold for gold in golds if gold]
    passages = [normalize_answer(text) for text in passage_texts]
    return any(gold in passage for gold in golds for passage in passages)


def _best_over_golds(prediction: str, golds: Sequence[str]) -> tuple[float, float]:
    return (max(exact_score(prediction, gold) for gold in golds),
            max(f1_score_v1(prediction, gold) for gold in golds))


class ProgressFileError(DilJaxError, ValueError):
    """An evaluation's progress file belongs to another evaluation, or is damaged."""


def question_record(example: SquadExample, by_score: dict[str, list[Candidate]], hits: list,
                    passage_texts: Sequence[str], p_values: Sequence[int], mu: float,
                    kept_texts: Sequence[str] | None = None) -> dict[str, Any]:
    """One question's results: R per p (0/1), and per span score rule and p, EM / F1 (0..1)
    without (EM, F1) and with (EM_ir, F1_ir) the IR score, and the picked answer's reader score
    (score, score_ir); JSON-ready (p as strings).

    by_score: rule -> this question's candidates; passage_texts: of `hits`, best first.
    kept_texts: under prescreening, the kept sentences of each of `hits`: then R_kept per p
    (0/1), a gold answer in the kept text of the first p passages (the seed's P(SEP)).
    """
    record: dict[str, Any] = dict(id=example.qid, unmatched=not hits, R={}, scores={})
    for p in p_values:
        record["R"][str(p)] = float(recall_at_p(example, passage_texts[:p]))
    if kept_texts is not None:
        record["R_kept"] = {str(p): float(recall_at_p(example, kept_texts[:p]))
                            for p in p_values}
    for rule, candidates in by_score.items():
        rows = record["scores"][rule] = {}
        for p in p_values:
            top = [c for c in candidates if c.rank < p]
            row = rows[str(p)] = {}
            for suffix, mu_value in (("", None), ("_ir", mu)):
                answer = pick_answer(top, mu_value)
                row["EM" + suffix], row["F1" + suffix] = _best_over_golds(
                    answer.text if answer else "", example.answer_texts)
                # The picked answer's reader score (whatever picked it): what an abstention
                # threshold compares (None: no candidate).
                row["score" + suffix] = None if answer is None else float(answer.reader_score)
    return record


def aggregate(records: Sequence[dict[str, Any]], p_values: Sequence[int]
              ) -> dict[str, dict[int, dict[str, float]]]:
    """rule -> p -> R, EM, F1, EM_ir, F1_ir in percent: the means of `question_record`s;
    with R_kept (prescreening) when every record has it."""
    n = len(records)
    rules = records[0]["scores"] if records else {}
    kept = bool(records) and all("R_kept" in r for r in records)
    return {rule: {p: dict(R=100 * sum(r["R"][str(p)] for r in records) / n,
                           **({"R_kept": 100 * sum(r["R_kept"][str(p)] for r in records) / n}
                              if kept else {}),
                           **{name: 100 * sum(r["scores"][rule][str(p)][name] for r in records) / n
                              for name in ("EM", "F1", "EM_ir", "F1_ir")})
                   for p in sorted(p_values)}
            for rule in rules}


BLOCK_FIELDS = {"questions": list, "wall_seconds": (int, float), "timings": dict}
RECORD_FIELDS = {"id": str, "unmatched": bool, "R": dict, "scores": dict}


def block_problem(block: Any) -> str | None:
    """What keeps a progress line from being a block as `evaluate_reader` writes it (the fields
    of the block and of each `question_record`, with their JSON types), or None."""
    for what, fields in (("block", BLOCK_FIELDS), ("question", RECORD_FIELDS)):
        items = [block] if what == "block" else block["questions"]
        for item in items:
            if not isinstance(item, dict):
                return f"a {what} is {type(item).__name__}, not an object"
            for name, kind in fields.items():
                if not isinstance(item.get(name), kind):
                    return f"a {what} lacks {name!r} or it is not {_kind_name(kind)}"
    return None


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def adopt_renamed_progress(path: str | os.PathLike, earlier: str | os.PathLike,
                           renamed: dict[str, tuple[Any, Any]]) -> bool:
    """Takes over the progress file an earlier version of the code wrote at `earlier` for the
    evaluation now recorded at `path` under new names of some settings (`renamed`: setting ->
    (its value then, its value now)), so that a rerun resumes it instead of reading again.

    Done only when `path` does not exist and `earlier` is a progress file whose header holds
    every old value: the header is rewritten with the new ones and the blocks are kept byte for
    byte, written to `path` (write, then rename) before `earlier` is removed. Anything else is
    left as it is (the evaluation then starts its own file). Returns whether it was taken over.
    """
    path, earlier = Path(path), Path(earlier)
    if path.exists() or not earlier.is_file():
        return False
    first, newline, rest = earlier.read_text(encoding="utf-8").partition("\n")
    try:
        header = json.loads(first)
    except json.JSONDecodeError:
        return False
    settings = header.get("settings") if isinstance(header, dict) else None
    if not isinstance(settings, dict) or any(settings.get(name) != old
                                             for name, (old, _) in renamed.items()):
        return False
    settings.update({name: new for name, (_, new) in renamed.items()})
    write_atomic(path, json.dumps(header) + newline + rest)
    earlier.unlink()
    log.info("%s: taken over from %s (written when %s)", path, earlier,
             ", ".join(f"{name} was {old!r}" for name, (old, _) in renamed.items()))
    return True


class EvaluationProgress:
    """The blocks of questions an evaluation has finished, one JSON line each, after a header
    line naming the evaluation (`settings`); `evaluate_reader` appends a line per block and, run
    again with the same settings, skips the questions already there.

    A last line cut short (a process killed while writing it) is dropped, and the file rewritten
    without it (write, then rename); any other unreadable line, or a header with other
    settings, is refused naming the file (and the setting).
    """

    def __init__(self, path: str | os.PathLike, settings: dict[str, Any]):
        self.path = Path(path)
        self.settings = json.loads(json.dumps(settings, default=str))  # as read back
        self.blocks: list[dict[str, Any]] = []
        if self.path.exists():
            self._load()
        else:
            write_atomic(self.path, json.dumps({"settings": self.settings}) + "\n")

    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8").splitlines()
        parsed = []
        for number, line in enumerate(lines, start=1):
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                if number < len(lines) or number == 1:
                    raise ProgressFileError(f"{self.path}: line {number} is not JSON; delete "
                                            f"the file to start this evaluation over") from None
                log.warning("%s: dropping its last line, cut short (a killed run)", self.path)
                write_atomic(self.path, "".join(f"{kept}\n" for kept in lines[:-1]))
        header = parsed[0].get("settings") if parsed and isinstance(parsed[0], dict) else None
        if not isinstance(header, dict):
            raise ProgressFileError(f"{self.path}: line 1 is not a progress header")
        for name in sorted(set(header) | set(self.settings)):
            if header.get(name) != self.settings.get(name):
                raise ProgressFileError(
                    f"{self.path} belongs to another evaluation: {name} = "
                    f"{header.get(name)!r} there, {self.settings.get(name)!r} now; delete it (or "
                    f"its --out folder) to start over")
        for number, block in enumerate(parsed[1:], start=2):
            problem = block_problem(block)
            if problem:
                raise ProgressFileError(f"{self.path}: line {number} is not a block of "
                                        f"questions ({problem}); delete the file to start this "
                                        f"evaluation over")
        self.blocks = parsed[1:]

    @property
    def done(self) -> dict[str, dict[str, Any]]:
        """question id -> its record, over every finished block."""
        return {record["id"]: record for block in self.blocks for record in block["questions"]}

    def append(self, block: dict[str, Any]) -> None:
        """Adds one finished block (its line flushed to disk before this returns)."""
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(block) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.blocks.append(block)


def evaluate_reader(reader: OpenDomainReader, examples: Sequence[SquadExample],
                    p_values: Sequence[int] = (29, 100), mu: float = 0.5, *,
                    progress: EvaluationProgress | None = None,
                    block_size: int = 64,
                    on_block: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Scores of one reader; `examples` must be answerable (SQuAD 1.1 style).

    by_p: p -> R and EM/F1 (without / with IR) under the reader's own span score rule;
    by_score: rule -> p -> the same, for every rule of the one read (R is the same for all).
    `unmatched` counts the questions that share no word with any passage (no BM25 hit): they
    are scored as unanswered (empty prediction), not errors. Questions are read in blocks of
    `block_size`; with `progress`, each finished block is recorded there and the questions it
    already holds are not read again (wall_seconds and timings then add up every block's,
    whichever process read it). on_block: called after each block with the number of questions
    read so far (those `progress` already held included), for a progress bar.
    """
    reader.top_p = max(p_values)
    done = progress.done if progress is not None else {}
    todo = [example for example in examples if example.qid not in done]
    blocks = list(progress.blocks) if progress is not None else []
    for start in range(0, len(todo), block_size):
        block = todo[start:start + block_size]
        started = time.perf_counter()
        result = reader.read([example.question for example in block])
        wall = time.perf_counter() - started
        records = [question_record(
            example, {rule: candidates[i] for rule, candidates in result.by_score.items()},
            hits, [reader.index.passages[h.passage_index].text for h in hits], p_values, mu,
            result.kept_texts[i] if result.kept_texts else None)
            for i, (example, hits) in enumerate(zip(block, result.hits, strict=True))]
        for record, pairs, tokens in zip(records, result.pairs_read, result.tokens_read,
                                         strict=True):
            record.update(pairs=pairs, tokens=tokens)  # what the upper blocks read
        finished = dict(questions=records, wall_seconds=wall, timings=result.timings)
        if progress is not None:
            progress.append(finished)
        else:
            blocks.append(finished)
        if on_block is not None:
            on_block(len(examples) - len(todo) + start + len(block))
        elif progress is not None and len(todo) > block_size:
            log.info("%s: %d of %d questions read", progress.path,
                     len(progress.done), len(examples))
    by_id = progress.done if progress is not None else {
        record["id"]: record for block in blocks for record in block["questions"]}
    records = [by_id[example.qid] for example in examples]
    every_block = progress.blocks if progress is not None else blocks
    timings: dict[str, float] = {}
    for block in every_block:
        for phase, seconds in block["timings"].items():
            timings[phase] = timings.get(phase, 0.0) + seconds
    by_score = aggregate(records, p_values)
    return dict(k=reader.reader.config.num_lower_layers, l=reader.reader.config.num_layers,
                questions=len(examples), unmatched=sum(r["unmatched"] for r in records), mu=mu,
                wall_seconds=sum(block["wall_seconds"] for block in every_block),
                timings=timings, span_score=reader.span_score,
                pruning=None if reader.pruning is None else reader.pruning.label,
                **read_sizes(records),
                by_p=by_score[reader.span_score], by_score=by_score)


def read_sizes(records: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """pairs_per_question and tokens_per_pair: what the upper blocks read, over the records
    that say (None when none does: progress files written before they were recorded)."""
    sized = [r for r in records if "pairs" in r]
    pairs = sum(r["pairs"] for r in sized)
    return dict(pairs_per_question=pairs / len(sized) if sized else None,
                tokens_per_pair=sum(r["tokens"] for r in sized) / pairs if pairs else None)


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    """One row per (reader, p, span score rule): R, EM/F1 without and with the IR score,
    the pairs a question's upper blocks read, reader time (one read serves every rule)."""
    lines = ["| reader | k/l | p | span score | R | EM | F1 | EM (+IR) | F1 (+IR) | pairs / q "
             "| pair-upper s | total s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in results.items():
        for p in result["by_p"]:
            for rule, rows in result["by_score"].items():
                row = rows[p]
                recall = f"{row['R']:.1f}"
                if "R_kept" in row:  # prescreening: the answer still in the kept sentences
                    recall += f" (kept {row['R_kept']:.1f})"
                lines.append(
                    f"| {name} | {result['k']}/{result['l']} | {p} | {rule} | {recall} | "
                    f"{row['EM']:.1f} | {row['F1']:.1f} | {row['EM_ir']:.1f} | "
                    f"{row['F1_ir']:.1f} | {_pairs_text(result)} | "
                    f"{result['timings']['pair_upper']:.1f} | "
                    f"{result['wall_seconds']:.1f} |")
    return "\n".join(lines)


def _pairs_text(result: dict[str, Any]) -> str:
    pairs = result.get("pairs_per_question")
    return "" if pairs is None else f"{pairs:.1f}"


def dump_json(results: dict[str, dict[str, Any]], extra: dict[str, Any]) -> str:
    return json.dumps({"results": results, **extra}, indent=2, default=str)
