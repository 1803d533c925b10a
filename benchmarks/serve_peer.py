"""The peer of `benchmarks/serve.py`: Hugging Face's `pipeline("question-answering")` on the same
weights, questions and contexts (docs/results/serving_log.md, "Against Hugging Face's pipeline").

Two steps, two interpreters:

    # dil_jax's interpreter: the bundled full reader as a complete Hugging Face folder (the
    # bundled one leaves its word embeddings to the base MiniLM, which transformers cannot do)
    python3 benchmarks/serve_peer.py export --out /tmp/serve2/peer-model

    # a venv with transformers 4.x (5.x has no question-answering pipeline any more):
    #   python3 -m venv --system-site-packages /work/venv-hf4
    #   /work/venv-hf4/bin/pip install 'transformers>=4.50,<5'
    /work/venv-hf4/bin/python benchmarks/serve_peer.py read --model /tmp/serve2/peer-model \
        --work WORK.json --out PEER.json

`read` takes the work `benchmarks/serve.py` writes: {"kind": "read", "items": [{question,
context}]} (one pipeline call per item, as /v1/read) or {"kind": "answer", "items":
[{question, contexts}]} (a question's retrieved passages read in one call; its answer is the
best-scored span, BERTserini-style), and each batch size in "batch_sizes". The pipeline's
windows hold max_seq_len - question - 3 context tokens, more than the server's 191 when the
question is short; with "exact_windows" the "read" items are also read one call each with
max_seq_len fitted to each question, so that both cut a long context at the same tokens. It
imports nothing of dil_jax, so the venv needs only transformers and torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class PipelineSettings:
    """The pipeline's windowing, set to the server's: max_seq_len = the server's question
    tokens + window tokens; doc_stride (the pipeline's overlap) = window - stride - 1."""

    max_seq_len: int
    doc_stride: int
    max_question_len: int
    max_answer_len: int = 15
    context_tokens: int = 191  # per window of the server: max_passage_len - 1 ([SEP])

    def for_question(self, question_tokens: int) -> PipelineSettings:
        """The same windows with max_seq_len fitted to this question, so that each window
        holds exactly the server's context tokens ([CLS] q [SEP] context [SEP]) whatever the
        question's length (the pipeline's own windows grow as the question shrinks)."""
        q = min(question_tokens, self.max_question_len - 2)
        return dataclasses.replace(self, max_seq_len=q + 3 + self.context_tokens)


def export(out: str) -> int:
    """Writes the bundled full reader as a complete float32 Hugging Face folder."""
    sys.path.insert(0, str(ROOT))
    from dil_jax.checkpoints import load_reader
    from dil_jax.checkpoints.export import export_hf_checkpoint
    from dil_jax.defaults import bundled_reader

    reader = load_reader(bundled_reader("full"), 0)
    export_hf_checkpoint(out, reader.params, reader.config, reader.tokenizer)
    print(f"wrote {out} (from {bundled_reader('full')})")
    return 0


def versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "tokenizers": tokenizers.__version__, "torch_threads": str(torch.get_num_threads()),
            "python": sys.version.split()[0]}


def _plain(answer: dict) -> dict:
    return {"answer": answer["answer"], "start": int(answer["start"]), "end": int(answer["end"]),
            "score": float(answer["score"])}


def _options(settings: PipelineSettings, batch_size: int) -> dict:
    return dict(max_seq_len=settings.max_seq_len, doc_stride=settings.doc_stride,
                max_question_len=settings.max_question_len,
                max_answer_len=settings.max_answer_len, batch_size=batch_size)


def read_exact(qa, items: list[dict], settings: PipelineSettings
               ) -> tuple[list[dict], list[float]]:
    """"read" items one call each, with the server's windows exactly (`for_question`)."""
    answers: list[dict] = []
    seconds: list[float] = []
    for item in items:
        started = time.perf_counter()
        tokens = len(qa.tokenizer(item["question"], add_special_tokens=False)["input_ids"])
        out = qa(question=item["question"], context=item["context"],
                 **_options(settings.for_question(tokens), 1))
        seconds.append(time.perf_counter() - started)
        answers.append(_plain(out))
    return answers, seconds


def read_items(qa, items: list[dict], kind: str, batch_size: int,
               settings: PipelineSettings) -> tuple[list[dict], list[float]]:
    """Each item's answer and the seconds it took. "read": an item is one call (the items are
    sent batch_size at a time, as the pipeline batches a list); "answer": an item's passages
    are one call batched by batch_size, the best-scored answer kept."""
    options = _options(settings, batch_size)
    answers: list[dict] = []
    seconds: list[float] = []
    if kind == "read":
        for first in range(0, len(items), batch_size):
            group = items[first:first + batch_size]
            started = time.perf_counter()
            out = qa(question=[i["question"] for i in group],
                     context=[i["context"] for i in group], **options)
            elapsed = time.perf_counter() - started
            out = out if isinstance(out, list) else [out]
            answers += [_plain(a) for a in out]
            seconds += [elapsed] * len(group)  # a question waits for its whole batch
        return answers, seconds
    for item in items:
        started = time.perf_counter()
        out = qa(question=[item["question"]] * len(item["contexts"]), context=item["contexts"],
                 **options)
        seconds.append(time.perf_counter() - started)
        out = out if isinstance(out, list) else [out]
        best = max(range(len(out)), key=lambda i: out[i]["score"])
        answers.append({**_plain(out[best]), "passage": best})
    return answers, seconds


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def read(model: str, work_path: str, out: str) -> int:
    from transformers import pipeline

    work = json.loads(Path(work_path).read_text())
    settings = PipelineSettings(**work["settings"])
    qa = pipeline("question-answering", model=model, tokenizer=model, device="cpu")
    qa(question="warm up?", context="The pipeline's first call builds its tokenizer state.")
    runs = []
    plans = [(batch_size, "pipeline's") for batch_size in work["batch_sizes"]]
    plans += [(1, "server's")] if work.get("exact_windows") else []
    for batch_size, windows in plans:
        started = time.perf_counter()
        if windows == "server's":
            answers, seconds = read_exact(qa, work["items"], settings)
        else:
            answers, seconds = read_items(qa, work["items"], work["kind"], batch_size, settings)
        wall = time.perf_counter() - started
        runs.append({"batch_size": batch_size, "windows": windows, "wall_s": wall,
                     "questions_per_s": len(answers) / wall,
                     "p50_s": statistics.median(seconds), "p95_s": percentile(seconds, 0.95),
                     "p99_s": percentile(seconds, 0.99), "answers": answers})
    record = {"versions": versions(), "settings": dataclasses.asdict(settings), "model": model,
              "kind": work["kind"], "items": len(work["items"]), "runs": runs,
              "loadavg": os.getloadavg()}
    Path(out).write_text(json.dumps(record) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    exporting = steps.add_parser("export", help="the bundled full reader as an HF folder")
    exporting.add_argument("--out", required=True)
    reading = steps.add_parser("read", help="read a work file with the pipeline")
    reading.add_argument("--model", required=True, help="HF folder (the export step's --out)")
    reading.add_argument("--work", required=True, help="work file of benchmarks/serve.py")
    reading.add_argument("--out", required=True, help="where to write the peer's record")
    args = parser.parse_args(argv)
    if args.step == "export":
        return export(args.out)
    return read(args.model, args.work, args.out)


if __name__ == "__main__":
    sys.exit(main())
