"""The arguments shared by several commands: types that check a flag's range where it is parsed,
the flag checks run before any work, the prescreening flags of the commands that read
(`add_reading_arguments`, `prescreen_from_args`), and the reader flags and flag checks of the
open-domain commands `index`, `ask` and `odqa-eval` (`add_reader_arguments`, `checked_first`)
and the readers those flags ask for (`reader_requests`, `ask_request`: `ReaderRequest`s, which
`dil_jax.readers.request` resolves and loads). Commands import each other never, only this.

A bad value ends in argparse's usual error (exit status 2) naming the flag and the value, e.g.
`dil-jax predict: error: argument --batch-size: must be an integer >= 1, got '0'`, before any
model or data is loaded.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dil_jax.defaults import OPEN_DOMAIN_BATCH_SIZE, OPEN_DOMAIN_MAX_QUESTION_LEN, SPAN_SCORES
from dil_jax.errors import UsageError
from dil_jax.options import OPTIONS, Bound, int_at_least, number_in

if TYPE_CHECKING:
    from dil_jax.readers.request import ReaderRequest

# ------------------------------------------------- help texts

def default_text(value: object) -> str:
    """A default as a user would type it: lists and tuples as space-separated values."""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) if value else "none"
    return str(value)


def says_default(text: str) -> bool:
    """Whether a help text states a default itself: "(default ...", "default: ..." or "(...;
    default ...)" -- not a mere mention such as "'default' (the embedded MiniLM)"."""
    return re.search(r"\(default\b|\bdefault:|; default\b", text) is not None


def help_with_default(action: argparse.Action) -> str:
    """An action's help ending in "(default: X)", unless the help already says its default.

    Left as they are: helps that mention "default" themselves (where None means something a
    value cannot show, e.g. "default: the checkpoint's own"), on/off switches (nargs=0: their
    default is always "off"), required flags and positionals without a default (they have
    none), and a None default (the help has to say what it means; tests/test_cli_help.py
    checks every such flag does)."""
    text = action.help or ""
    if says_default(text) or action.nargs == 0 or action.required:
        return text
    if action.default is None or action.default is argparse.SUPPRESS:
        return text
    # argparse %-formats help strings: a literal % in the default must be doubled.
    shown = default_text(action.default).replace("%", "%%")
    return f"{text} (default: {shown})" if text else f"(default: {shown})"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every command's formatter (set in dil_jax.cli): descriptions keep their line breaks (they
    are module docstrings laid out by hand), and each flag's help ends with its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return help_with_default(action)


def flag_type(bound: Bound) -> Callable[[str], int | float]:
    """An argparse type of a `dil_jax.options.Bound`: the text parsed as its kind, then
    checked by it, so a flag and a config key with one rule refuse the same values."""

    def parse(text: str) -> int | float:
        try:
            value = bound.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {bound.wanted}, got {text!r}") from None
        if bound(value) is not None:
            raise argparse.ArgumentTypeError(f"must be {bound.wanted}, got {text!r}")
        return value

    parse.__name__ = bound.wanted  # argparse names the type in some messages
    return parse


def option_type(name: str) -> Callable[[str], int | float]:
    """The argparse type of an option a training config key names too (`OPTIONS`)."""
    return flag_type(OPTIONS[name])


positive_int = flag_type(int_at_least(1))
"""An integer >= 1 (sizes, counts, limits)."""
non_negative_int = flag_type(int_at_least(0))
"""An integer >= 0 (k, seeds, offsets)."""
positive_float = flag_type(number_in(0, low_open=True))
"""A finite number > 0."""
fraction = flag_type(number_in(0, 1, low_open=True))
"""A number in (0, 1] (probability mass, shares)."""
unit_interval = flag_type(number_in(0, 1))
"""A number in [0, 1] (mixing weights)."""
finite_float = flag_type(number_in())
"""Any finite number (thresholds)."""
window_len = option_type("max_passage_len")
"""Passage window length: at least one passage token and the [SEP]."""


def chunk_size_setting(text: str) -> int | str:
    """--chunk-size: pairs per step of the pair program, `auto` (measured once on this machine
    for the reader, then read from the record) or `measure` (measured again)
    (`dil_jax.open_domain.chunk_size`)."""
    from dil_jax.open_domain.chunk_size import parse_setting

    try:
        return parse_setting(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


chunk_size_setting.__name__ = "chunk size"
CHUNK_SIZE_HELP = ("pairs per step of the pair program: N, 'auto' (on CPU: measured once per "
                   "machine and reader in a few seconds, then read from the record; "
                   "accelerators: 64 unless measured) or 'measure' (measure again); "
                   "docs/open_domain.md, \"Pairs per chunk\"")


def cache_storage(text: str):
    """A passage cache storage scheme (--cache-dtype): float32, bfloat16, int8, pca<d> or
    pq<M>, as the `dil_jax.open_domain.cache.storage.Storage` the commands carry from here on
    (d <= the hidden size, M dividing it, are checked once the model loads)."""
    from dil_jax.open_domain.cache.storage import CacheStorageError, Storage

    try:
        return Storage.parse(text)
    except CacheStorageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


cache_storage.__name__ = "cache storage"


def int_list(element: Callable[[str], int]) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, e.g. `8,10,11`, each checked by `element`."""

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(element(part.strip()) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        return values

    parse.__name__ = f"comma-separated list of {element.__name__}"
    return parse


def check_window_flags(max_passage_len: int, doc_stride: int,
                       length_flag: str = "--max-passage-len",
                       stride_flag: str = "--doc-stride") -> None:
    """Windows hold max_passage_len - 1 passage tokens and a [SEP] and advance by doc_stride: a
    stride beyond a window would skip passage text, so it must be < max_passage_len."""
    from dil_jax.errors import UsageError

    if doc_stride >= max_passage_len:
        raise UsageError(f"{stride_flag} {doc_stride} must be smaller than {length_flag} "
                         f"{max_passage_len} (a window holds {length_flag} - 1 passage tokens "
                         f"and moves by {stride_flag}); lower {stride_flag} or raise "
                         f"{length_flag}")


def require_file(path: str, flag: str, what: str = "file") -> None:
    """Raises InputFileError unless `path` (given as `flag`) is an existing file (not a folder)."""
    import os

    from dil_jax.errors import InputFileError

    if os.path.isdir(path):
        raise InputFileError(f"{flag} {path} is a folder, not a {what}; give the {what} itself")
    if not os.path.exists(path):
        raise InputFileError(f"{flag} {path}: no such {what}")


def add_compilation_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """--compilation-cache / --no-compilation-cache of a command that compiles XLA programs;
    dil_jax.cli applies them (`dil_jax.compilation_cache`) around the command's run."""
    parser.add_argument("--compilation-cache", default=None, metavar="DIR",
                        help="keep compiled XLA programs in DIR, so that the next run of a "
                             "command reads them instead of compiling again; default: "
                             "$DIL_JAX_COMPILATION_CACHE when it names a folder, else "
                             "$JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/dil_jax/jax "
                             "(~/.cache/dil_jax/jax)")
    parser.add_argument("--no-compilation-cache", action="store_true",
                        help="compile every program afresh and keep nothing (or set "
                             "DIL_JAX_COMPILATION_CACHE=0)")
    parser.set_defaults(compiles=True)


def add_reading_arguments(parser: argparse.ArgumentParser, where: str) -> None:
    """--prescreen/--top-m/--mass of the commands that read (`where` completes the help)."""
    parser.add_argument("--prescreen", default=None, metavar="PRESCREENER",
                        help="read only the prescreened sentences of each passage in the upper "
                             "blocks ('default' = the bundled prescreener, or a folder written "
                             f"by dil-jax prescreen){where}; default: no prescreening, whole "
                             "passages")
    parser.add_argument("--top-m", type=positive_int, default=2,
                        help="with --prescreen: keep the m best sentences of each passage")
    parser.add_argument("--mass", type=fraction, default=None,
                        help="with --prescreen: keep the fewest best sentences holding this "
                             "much probability (at most --top-m); default: --top-m alone")


def window_pruning(text: str):
    """--prune-windows: "all" (None), "stop" or "stop:H", as a
    `dil_jax.open_domain.pruning.WindowPruning` settled for fusion at the default weight (the
    command sets its own: `WindowPruning.with_mu`), or "calibrated" (`pruning.CALIBRATED`:
    each reader's own, `pruning.resolve_pruning`)."""
    from dil_jax.open_domain.pruning import WindowPruningError, parse_setting

    try:
        return parse_setting(text)
    except WindowPruningError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


window_pruning.__name__ = "window pruning"

PRUNING_HELP = (
    "which windows of the retrieved passages the upper blocks read: 'all'; 'stop' reads "
    "passages in BM25 order until no unread one can change the answer (exact: the same answer "
    "as 'all' for --span-score and the fusion weight, from a bound on the reader's scores; "
    "saves pairs only with fusion); 'stop:H' stops sooner, assuming no unread passage's reader "
    "score exceeds H (approximate; H calibrated per reader and rule: docs/open_domain.md, "
    "\"Window pruning\"); 'calibrated': the stop:H recorded in the reader's manifest for "
    "--span-score, the fusion weight and the depth, else 'stop', else 'all' (a reader that "
    "cannot prune, or no fusion)")


def add_matmul_argument(parser: argparse.ArgumentParser) -> None:
    """--matmul-dtype of `predict`, `ask`, `odqa-eval` and `serve` (`readers.matmul`)."""
    from dil_jax.defaults import BFLOAT16_MARGIN, MATMUL_CHOICES

    parser.add_argument("--matmul-dtype", choices=MATMUL_CHOICES, default="float32",
                        help="what a BERT-family reader's dense matmuls read: float32 (exact), "
                             "bfloat16 (both operands rounded, float32 accumulation: faster "
                             "on CPUs with AVX512-BF16 or AMX, slower elsewhere; its cost in "
                             "EM is in docs/serving.md) or auto (bfloat16 where a start-up "
                             f"measurement finds its dot x{BFLOAT16_MARGIN} float32's or "
                             "faster) (default: float32)")


def add_pruning_argument(parser: argparse.ArgumentParser, where: str,
                         default: str = "all") -> None:
    """--prune-windows of `ask`, `odqa-eval` and `serve` (`where` completes the help)."""
    parser.add_argument("--prune-windows", type=window_pruning, default=default, metavar="RULE",
                        help=f"{PRUNING_HELP}{where} (default: {default})")


def prescreen_from_args(args: argparse.Namespace) -> tuple | None:
    """(SentencePrescreener, SentenceRule) of --prescreen/--top-m/--mass, or None."""
    if not args.prescreen:
        return None
    from dil_jax.prescreening.prescreener import SentencePrescreener
    from dil_jax.prescreening.screen import SentenceRule

    return (SentencePrescreener.load(args.prescreen),
            SentenceRule(top_m=args.top_m, mass=args.mass))


# ------------------------------------------------- the open-domain commands (index, ask, odqa-eval)
#
# The reader flags those three commands share (commands/index.py registers `index`,
# commands/odqa.py `ask` and `odqa-eval`), the checks of their flags run before anything loads,
# and the readers the flags name.

STORAGE_HELP = ("how the cached states are stored: float32, bfloat16, int8 (per-token "
                "scales), pca<d> (e.g. pca64: d PCA coordinates as int8) or pq<M> (e.g. pq32: "
                "M bytes a token, product-quantized; building one needs faiss, the [pq] "
                "extra); readers must name the same (docs/open_domain.md)")

DEFAULT_STORAGE_HELP = ("; default: int8 for a new cache (a quarter of float32's disk, as "
                        "accurate in docs/open_domain.md, \"The passage cache\"), the existing "
                        "cache's own otherwise")

NO_REUSE_HELP = ("read the cache as if it held no first-upper-block arrays (dil-jax index "
                 "--cache-reuse): the reference, for timing")


def add_reader_arguments(parser: argparse.ArgumentParser, many_k: bool) -> None:
    """The reader flags of `index`, `ask` and `odqa-eval` (--checkpoint, --tokenizer, --k,
    lengths, batch and chunk sizes, --span-score); many_k: several readers, one per --k."""
    # None = the bundled fine-tuned readers (resolved when the command runs, by k): a user's
    # first `ask` must not read with the raw MiniLM's untrained QA head.
    parser.add_argument("--checkpoint", default=None, nargs="+" if many_k else None,
                        help="reader: a dil_jax (orbax) or Hugging Face folder, or 'default' "
                             "(the raw embedded MiniLM, QA head untrained)"
                             + ("; one for all k, or one per k (in --k order)" if many_k else "")
                             + "; default: the bundled fine-tuned readers, the full one for "
                               "k = 0 and the delayed one for k >= 1"
                             + ("" if many_k else
                                " (without --k: the full one, or the delayed one when the "
                                "index has only its cache)"))
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the "
                                                          "checkpoint's own)")
    if many_k:
        parser.add_argument("--k", type=option_type("num_lower_layers"), nargs="+", default=[0],
                            help="split points to cache/read (0 = the full model)")
    else:
        parser.add_argument("--k", type=option_type("num_lower_layers"), default=None,
                            help="split point (default: the checkpoint's own; 0 for HF ones)")
    parser.add_argument("--max-question-len", type=option_type("max_question_len"),
                        default=OPEN_DOMAIN_MAX_QUESTION_LEN,
                        help="tokens of `[CLS] question [SEP]`, padded (the bundled readers "
                             "were trained with 32)")
    parser.add_argument("--batch-size", type=positive_int, default=OPEN_DOMAIN_BATCH_SIZE,
                        help="questions per batch")
    parser.add_argument("--chunk-size", type=chunk_size_setting, default=None,
                        help=CHUNK_SIZE_HELP + "; default: the size recorded on this machine "
                        "for the reader (by `serve` or an earlier 'auto'), else 8 on CPU and "
                        "64 on accelerators, never measured")
    parser.add_argument("--span-score", choices=SPAN_SCORES, default="logits",
                        help="how passages' best spans compare: 'logits' (s_start + s_end, the "
                             "paper's) or 'margin' (less the window's no-answer score)"
                             + ("; odqa-eval reports every rule from one read, this one "
                                "first" if many_k else ""))


def checked_first(check: Callable[[argparse.Namespace], None],
                  run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`run`, preceded by `check(args)`: flag relations and output paths are refused before any
    model, index or corpus is loaded."""
    def checked(args: argparse.Namespace) -> int:
        check(args)
        return run(args)

    checked.__name__ = run.__name__
    checked.__doc__ = run.__doc__
    return checked


def check_checkpoint_count(args: argparse.Namespace) -> None:
    """--checkpoint gives one value for all --k, or one per k."""
    if isinstance(args.checkpoint, list) and len(args.checkpoint) not in (1, len(args.k)):
        raise UsageError(f"--checkpoint has {len(args.checkpoint)} values and --k has "
                         f"{len(args.k)}: give one checkpoint for all k, or one per k")


def local_paths(values: str | list[str] | None) -> list[str]:
    """The values of a path flag that name local files ('default' names a bundled one)."""
    values = [values] if isinstance(values, str) or values is None else values
    return [v for v in values if v and v != "default"]


def checkpoint_for(args: argparse.Namespace, position: int) -> str | None:
    """The --checkpoint of the position-th --k (one for all, or one per k); None when not
    given (the bundled reader of its k: `ReaderRequest.resolved`)."""
    if args.checkpoint is None or isinstance(args.checkpoint, str):
        return args.checkpoint
    if len(args.checkpoint) == 1:
        return args.checkpoint[0]
    return args.checkpoint[position]  # one per k: check_checkpoint_count ran first


def reader_requests(args: argparse.Namespace) -> list[ReaderRequest]:
    """The reader of each --k of `index` and `odqa-eval`: its --checkpoint (`checkpoint_for`;
    not given: the bundled reader of that k), split at k, with --max-question-len and
    --tokenizer. Resolved: each names its checkpoint, so every later use sees one path."""
    from dil_jax.readers.request import ReaderRequest

    # `index` builds caches in float32 (it has no --matmul-dtype).
    matmul_dtype = getattr(args, "matmul_dtype", "float32")
    return [ReaderRequest(checkpoint_for(args, position), k, args.max_question_len,
                          args.tokenizer, matmul_dtype=matmul_dtype).resolved()
            for position, k in enumerate(args.k)]


def ask_request(args: argparse.Namespace) -> ReaderRequest:
    """The reader `ask` reads with: --checkpoint at --k, or the bundled reader of --k; without
    --k the full one unless the index holds only the delayed reader's cache
    (`defaults.default_reader_role`), named on stderr."""
    from dil_jax.readers.request import ReaderRequest

    request = ReaderRequest(args.checkpoint, args.k, args.max_question_len, args.tokenizer,
                            matmul_dtype=args.matmul_dtype)
    if request.checkpoint is not None:
        return request
    index_ks: set[int] = set()
    if args.k is None:
        from dil_jax.open_domain.cache.missing import index_caches

        index_ks = {c.k for c in index_caches(Path(args.index)) if c.k is not None}
    resolved = request.resolved(index_ks)
    print(f"reader: the bundled {request.role(index_ks)} reader ({resolved.checkpoint})",
          file=sys.stderr)
    return resolved
