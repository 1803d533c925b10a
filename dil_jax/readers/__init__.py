"""Readers: one `Reader` protocol, its two families, and loading any checkpoint into one.

  protocol  Reader (model, params, tokenizer, checkpoint; what every family does),
            ReaderCapabilities, LoadOptions, TokenRows (one side of a grid), FixedSplitError,
            LshLayersError
  encoder   EncoderReader: the BERT family (DelayedInteractionModel, PairGrid), init_reader,
            UntrainedHeadError
  char      CharReader: QANet and BiDAF (characters beside the ids, CharPairGrid)
  loading   READER_FAMILIES (model kind -> family), reader_family, load_reader (any checkpoint),
            complete_export (a reader -> a complete Hugging Face folder)
  request   ReaderRequest (a reader asked for: checkpoint or bundled role, k, question length,
            tokenizer, the flags that said so), load_requested: the commands' and the server's
            one entrance

Below this package: the checkpoint formats (`dil_jax.checkpoints`), the models and the grids
(`dil_jax.reading`); above it, everything that reads (predict, open_domain, serve, train, bench,
the commands) holds a Reader and asks it, never which family it is.
"""

from dil_jax.readers.char import CharReader
from dil_jax.readers.encoder import EncoderReader, UntrainedHeadError, init_reader
from dil_jax.readers.loading import READER_FAMILIES, complete_export, load_reader, reader_family
from dil_jax.readers.protocol import (
    FixedSplitError,
    LoadOptions,
    LshLayersError,
    Reader,
    ReaderCapabilities,
    TokenRows,
)
from dil_jax.readers.request import ReaderRequest, load_requested

__all__ = [
    "READER_FAMILIES", "CharReader", "EncoderReader", "FixedSplitError", "LoadOptions",
    "LshLayersError", "Reader", "ReaderCapabilities", "ReaderRequest", "TokenRows",
    "UntrainedHeadError", "complete_export", "init_reader", "load_reader", "load_requested",
    "reader_family",
]
