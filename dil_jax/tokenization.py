"""Tokenization of the two segments with the checkpoint's own fast tokenizer.

Question segment: `[CLS] q [SEP]`, padded to `max_question_len`.
Passage segment:  `p [SEP]`, padded to `max_passage_len`.

The special tokens are the tokenizer's own pair layout (`pair_layout`), cut before the passage:
BERT's `[CLS] q [SEP] p [SEP]` gives the above; RoBERTa's and XLM-RoBERTa's `<s> q </s></s> p </s>`
gives the question segment `<s> q </s></s>` and the passage segment `p </s>`, so that the two
segments side by side are exactly what the tokenizer builds for the pair. XLNet's
`A <sep> B <sep> <cls>` is the one layout read otherwise: its segments are `<cls> q <sep>` and
`p <sep>`, and the XLNet reader gives each token its place in `P [SEP] Q [SEP] [CLS]` itself
(`model/xlnet.py`, positions and segment ids).

Character offsets into the source text are kept for every token (-1 for special tokens and
padding), so answer spans are recovered from the original text, never from detokenized pieces.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dil_jax.errors import DilJaxError
from dil_jax.hub import resolve_checkpoint

log = logging.getLogger(__name__)

NO_OFFSET = -1


class TokenizationError(DilJaxError, ValueError):
    """Text that cannot be encoded (e.g. an empty question); the message names which one."""


@dataclasses.dataclass
class Segments:
    """A padded batch of one segment kind.

    Attributes:
      ids: [batch, seq] int32 token ids.
      mask: [batch, seq] int32, 1 for tokens, 0 for padding.
      offsets: [batch, seq, 2] int32 character [start, end) of each token in its text;
        NO_OFFSET for special tokens and padding.
      truncated: indices of the texts that did not fit and were cut.
    """

    ids: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray
    truncated: list[int] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return self.ids.shape[0]


# Files a fast tokenizer of a supported architecture is built from (BERT/DistilBERT WordPiece:
# tokenizer.json or vocab.txt; ALBERT SentencePiece: tokenizer.json or spiece.model).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "spiece.model")
# Special tokens every reader input needs: [CLS] q [SEP], p [SEP], padding, unknown words.
_SPECIAL_TOKENS = ("cls_token", "sep_token", "pad_token", "unk_token")


def load_tokenizer(name_or_path: str | os.PathLike, vocab_size: int | None = None,
                   architecture: str | None = None):
    """The checkpoint's fast tokenizer (offsets need a fast one) from a folder or hub id.

    vocab_size: the model's embedding rows, if known; the tokenizer is then checked against it
    and the reader's `architecture` (`check_tokenizer`). Raises TokenizationError naming the
    folder and what is missing.
    """
    folder = resolve_checkpoint(name_or_path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        # Why refuse here: with tokenizer_config.json alone transformers builds a tokenizer of
        # just the special tokens, and every word becomes [UNK] (a silent wrong answer).
        raise TokenizationError(
            f"{folder}: no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); copy the "
            "tokenizer of the model this checkpoint came from into it, or pass --tokenizer")
    try:
        tokenizer = tokenizer_class(folder).from_pretrained(str(folder), use_fast=True)
    except Exception as error:  # a corrupt tokenizer.json / vocab: name the folder, not a trace
        raise TokenizationError(f"{folder}: cannot load the tokenizer ({type(error).__name__}: "
                                f"{error}); re-download or re-export its tokenizer files"
                                ) from error
    if not tokenizer.is_fast:
        raise TokenizationError(f"{folder}: no fast tokenizer (tokenizer.json); offsets need one")
    if vocab_size is not None:
        check_tokenizer(tokenizer, vocab_size, str(folder), architecture)
    return tokenizer


def tokenizer_class(folder: Path) -> type:
    """The class AutoTokenizer would build for `folder`, imported without AutoTokenizer.

    Importing transformers' auto mappings takes about a second and a half of a CLI command's
    start; the class named by tokenizer_config.json's `tokenizer_class` imports in a fraction of
    that. Same rule as AutoTokenizer with use_fast=True: the class's "Fast" variant when the
    installed transformers has one. Anything else (no config, no class, a class transformers
    does not export) goes through AutoTokenizer.
    """
    import transformers

    try:
        name = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get(
            "tokenizer_class")
    except (OSError, ValueError, AttributeError):
        name = None
    if isinstance(name, str) and name.isidentifier():
        for candidate in (name if name.endswith("Fast") else name + "Fast", name):
            try:
                return getattr(transformers, candidate)
            except (AttributeError, ImportError):  # not exported, or its backend is missing
                continue
    return transformers.AutoTokenizer


def check_tokenizer(tokenizer, vocab_size: int, source: str,
                    architecture: str | None = None) -> None:
    """Raises TokenizationError unless `tokenizer` can be this model's.

    Its ids must index the embedding table (len(tokenizer) <= vocab_size) and it must not be
    far smaller (< half the table: some other model's, or one built without its vocabulary
    file); [CLS], [SEP], [PAD] and [UNK] must exist with ids < vocab_size. A few unused rows are
    normal (tables are often padded to a round size). Its pair layout must be one a reader
    reads (`pair_layout`); XLNet's (`PairLayout.cls_last`) only an XLNet reader, when the
    reader's `architecture` is given.
    """
    size = len(tokenizer)
    if size > vocab_size:
        raise TokenizationError(
            f"{source}: the tokenizer has {size} tokens but the checkpoint's vocabulary is "
            f"{vocab_size}: not this checkpoint's tokenizer (pass the right one with --tokenizer)")
    if size < vocab_size // 2:
        raise TokenizationError(
            f"{source}: the tokenizer has only {size} tokens for a vocabulary of {vocab_size}: "
            "not this checkpoint's tokenizer, or its vocabulary file is missing "
            f"(expected one of {', '.join(TOKENIZER_FILES)})")
    for name in _SPECIAL_TOKENS:
        token_id = getattr(tokenizer, f"{name}_id", None)
        if token_id is None or not 0 <= token_id < vocab_size:
            raise TokenizationError(
                f"{source}: the tokenizer's {name} ({getattr(tokenizer, name, None)!r}) "
                f"{'is missing' if token_id is None else f'has id {token_id}'}; a reader needs "
                f"[CLS], [SEP], [PAD] and [UNK] with ids below the vocabulary size {vocab_size}")
    absent = specials_outside_vocabulary(tokenizer)
    if absent:
        name, token, token_id = absent[0]
        raise TokenizationError(
            f"{source}: the tokenizer's {name} {token!r} is not in its vocabulary: transformers "
            f"added it on load as a new token with id {token_id}, a row the model never learned "
            f"as {token!r} (missing: {', '.join(repr(t) for _, t, _ in absent)}); the tokenizer "
            "files are damaged or another model's: re-download or re-export them")
    try:
        layout = pair_layout(tokenizer)
    except TokenizationError as error:
        raise TokenizationError(f"{source}: {error}") from error
    if layout.cls_last and architecture not in (None, "xlnet"):
        raise TokenizationError(
            f"{source}: the tokenizer ({type(tokenizer).__name__}) puts its cls token after the "
            f"passage (XLNet's pair layout), which only an XLNet reader reads; the reader's "
            f"architecture is {architecture!r}: not this checkpoint's tokenizer")


def specials_outside_vocabulary(tokenizer) -> list[tuple[str, str, int]]:
    """(name, token, id) of each special token a reader needs that the tokenizer's own
    vocabulary lacks, or holds under another id.

    Why: when a tokenizer file lacks e.g. `[SEP]`, transformers appends it as an added token
    (id 30521 for MiniLM), which still fits the embedding table, so only this finds it. A
    tokenizer without a backend (no vocabulary to look in) is not checked here.
    """
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    if model is None:
        return []
    absent = []
    for name in _SPECIAL_TOKENS:
        token, token_id = getattr(tokenizer, name, None), getattr(tokenizer, f"{name}_id", None)
        # The model's own lookup (no added tokens), not get_vocab(): ~0.01 ms against ~20 ms.
        if token is not None and model.token_to_id(str(token)) != token_id:
            absent.append((name, str(token), token_id))
    return absent


def vocabulary_fingerprint(tokenizer) -> str:
    """16 hex digits of the SHA-256 of the sorted (token, id) pairs, added tokens included.

    Another vocabulary, the same one with ids permuted, or one token missing all change it.
    The same hash as the open-domain caches' `tokenizer_fingerprint` after its class-name prefix
    (left out here: a transformers release that renames the class does not change the ids).
    """
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def special_token_ids(tokenizer) -> dict[str, list]:
    """{name: [token, id]} of the special tokens a reader needs ([CLS], [SEP], [PAD], [UNK])."""
    return {name: [str(getattr(tokenizer, name, None)), getattr(tokenizer, f"{name}_id", None)]
            for name in _SPECIAL_TOKENS}


@dataclasses.dataclass(frozen=True)
class PairLayout:
    """Where a tokenizer puts its special tokens in a (question, passage) pair.

    first: the token before the question (`[CLS]`, `<s>`), whose logits are the null score;
    question_end: the tokens between question and passage (`[SEP]`; RoBERTa `</s></s>`);
    passage_end: the token after the passage (`[SEP]`, `</s>`), always `sep_token_id`;
    cls_last: XLNet's layout, `q <sep> p <sep> <cls>`: `first` (`<cls>`) comes after the
      passage in the tokenizer's pair. The segments still store it first; the XLNet reader
      places it last itself (`model/xlnet.pair_layout`).
    """

    first: int
    question_end: tuple[int, ...]
    passage_end: int
    cls_last: bool = False

    @property
    def question_specials(self) -> int:
        """Special tokens of a question segment: 1 + len(question_end)."""
        return 1 + len(self.question_end)


# pair_layout of each tokenizer read so far: every question batch asks (a served request
# too), and reading it costs a tokenizer call.
_PAIR_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def pair_layout(tokenizer) -> PairLayout:
    """The tokenizer's pair layout, read from what it builds for a pair of one-word texts
    (once per tokenizer object).

    Raises TokenizationError when the layout is not `first q question_end p sep` with one
    token before the question (the null score reads it) and the tokenizer's sep after the
    passage (SQuAD windows end with it), nor XLNet's `a sep b sep cls` (`_is_xlnet_layout`).
    """
    try:
        return _PAIR_LAYOUTS[tokenizer]
    except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
        pass
    layout = _read_pair_layout(tokenizer)
    try:
        _PAIR_LAYOUTS[tokenizer] = layout
    except TypeError:
        pass
    return layout


def _read_pair_layout(tokenizer) -> PairLayout:
    encoded = tokenizer("a", "b")
    ids, sequence = encoded["input_ids"], encoded.sequence_ids()
    question = [i for i, s in enumerate(sequence) if s == 0]
    passage = [i for i, s in enumerate(sequence) if s == 1]
    if not question or not passage:
        raise TokenizationError(f"the tokenizer ({type(tokenizer).__name__}) does not encode "
                                "text pairs; a reader needs its question-passage layout")
    before, between = ids[:question[0]], ids[question[-1] + 1:passage[0]]
    after = ids[passage[-1] + 1:]
    if _is_xlnet_layout(tokenizer, before, between, after):
        return PairLayout(tokenizer.cls_token_id, (tokenizer.sep_token_id,),
                          tokenizer.sep_token_id, cls_last=True)
    if len(before) != 1 or not between or after != [tokenizer.sep_token_id]:
        tokens = tokenizer.convert_ids_to_tokens(ids)
        raise TokenizationError(
            f"unsupported pair layout {tokens} of {type(tokenizer).__name__}: a reader needs "
            f"one token before the question, at least one between question and passage and "
            f"the sep token ({tokenizer.sep_token!r}) alone after the passage")
    return PairLayout(before[0], tuple(between), after[0])


def _is_xlnet_layout(tokenizer, before: list[int], between: list[int],
                     after: list[int]) -> bool:
    """Whether the pair is XLNet's `a <sep> b <sep> <cls>`: nothing before the first text, the
    cls token last. Read as `<cls> q <sep>` / `p <sep>` segments because the XLNet reader puts
    `[CLS]` last itself (its positions, `model/xlnet.pair_layout`); `check_tokenizer` refuses
    it for any other reader."""
    sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
    return not before and between == [sep] and after == [sep, cls]


def _pack(pieces: list[tuple[list[int], list[tuple[int, int]]]], length: int,
          pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.full((len(pieces), length), pad_id, dtype=np.int32)
    mask = np.zeros((len(pieces), length), dtype=np.int32)
    offsets = np.full((len(pieces), length, 2), NO_OFFSET, dtype=np.int32)
    for row, (token_ids, token_offsets) in enumerate(pieces):
        n = len(token_ids)
        ids[row, :n] = token_ids
        mask[row, :n] = 1
        offsets[row, :n] = np.asarray(token_offsets, dtype=np.int32).reshape(n, 2)
    return ids, mask, offsets


def lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in `text` (a JSON escape "\\ud800" without its
    pair, or a command-line byte that was not UTF-8), or None. Such a string is not Unicode
    text, and tokenizers reject it with a bare TypeError that names nothing."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as error:
        return error.start


def surrogate_problem(text: str, index: int) -> str:
    """What is wrong with `text`, whose character `index` is a lone surrogate (its repr: the
    message must print, and a lone surrogate itself cannot)."""
    return (f"a lone surrogate {text[index]!r} at character {index} (after "
            f"{text[max(0, index - 20):index]!r}): not valid Unicode text (a broken \\u escape, "
            "or bytes that are not UTF-8?); fix the text")


def _tokenize(tokenizer, texts: Sequence[str], kind: str = "text"
              ) -> tuple[list[list[int]], list[list[tuple]]]:
    """Token ids and character offsets of each text (no special tokens).

    kind: what the texts are ("question", "passage"), for the error naming a text that is not
    Unicode (looked for only after the tokenizer refused, so it costs nothing otherwise).
    """
    try:
        encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True,
                            return_attention_mask=False, return_token_type_ids=False)
    except TypeError:
        for index, text in enumerate(texts):
            if isinstance(text, str) and (position := lone_surrogate(text)) is not None:
                raise TokenizationError(f"{kind} {index}: {surrogate_problem(text, position)}"
                                        ) from None
        raise
    return encoded["input_ids"], encoded["offset_mapping"]


def encode_questions(tokenizer, questions: Sequence[str], max_question_len: int) -> Segments:
    """`[CLS] q [SEP]` for each question (the tokenizer's `pair_layout`: RoBERTa
    `<s> q </s></s>`), padded to max_question_len.

    Raises TokenizationError for an empty question; over-long ones are truncated, with a warning
    naming how many and which.
    """
    layout = pair_layout(tokenizer)
    if max_question_len < layout.question_specials + 1:
        special = tokenizer.convert_ids_to_tokens([layout.first, *layout.question_end])
        raise TokenizationError(
            f"max_question_len must be >= {layout.question_specials + 1} ({special[0]} q "
            f"{' '.join(special[1:])}), got {max_question_len}")
    token_ids, token_offsets = _tokenize(tokenizer, questions, "question")
    room = max_question_len - layout.question_specials
    no_offsets = [(NO_OFFSET, NO_OFFSET)] * len(layout.question_end)
    pieces, truncated = [], []
    for index, (ids, offsets) in enumerate(zip(token_ids, token_offsets)):
        if not ids:
            raise TokenizationError(f"question {index} is empty ({questions[index]!r})")
        if len(ids) > room:
            truncated.append(index)
            ids, offsets = ids[:room], offsets[:room]
        pieces.append(([layout.first, *ids, *layout.question_end],
                       [(NO_OFFSET, NO_OFFSET), *offsets, *no_offsets]))
    if truncated:
        log.warning("%d question(s) longer than max_question_len=%d were truncated "
                    "(indices %s)", len(truncated), max_question_len, truncated[:10])
    return Segments(*_pack(pieces, max_question_len, tokenizer.pad_token_id), truncated)


def encode_passages(tokenizer, passages: Sequence[str], max_passage_len: int) -> Segments:
    """`p [SEP]` for each passage, padded to max_passage_len; longer ones are cut with a warning.

    (SQuAD featurization splits long passages into strided windows instead of cutting them.)
    """
    if max_passage_len < 2:
        raise TokenizationError(f"max_passage_len must be >= 2 (p [SEP]), got {max_passage_len}")
    token_ids, token_offsets = _tokenize(tokenizer, passages, "passage")
    room = max_passage_len - 1
    pieces, truncated = [], []
    for index, (ids, offsets) in enumerate(zip(token_ids, token_offsets)):
        if len(ids) > room:
            truncated.append(index)
            ids, offsets = ids[:room], offsets[:room]
        pieces.append(([*ids, tokenizer.sep_token_id], [*offsets, (NO_OFFSET, NO_OFFSET)]))
    if truncated:
        log.warning("%d passage(s) longer than max_passage_len=%d were truncated (indices %s)",
                    len(truncated), max_passage_len, truncated[:10])
    return Segments(*_pack(pieces, max_passage_len, tokenizer.pad_token_id), truncated)
