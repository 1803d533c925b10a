"""`QANetConfig`: QANet's hyper-parameters (the paper's as defaults) and its Reformer options.

Defaults are Yu et al. (2018), "QANet", section 2.2 and 3.1: d_model 128, 8 heads; the embedding
encoder is 1 block of 4 depthwise-separable convolutions with kernel 7; the model encoder 7 blocks
of 2 convolutions, "the same building block" (so kernel 7 too; several public implementations use
5 there: `model_kernel`), applied three times with shared weights; characters truncated or padded
to 16 per word; a two-layer highway; dropout 0.1 between layers and 0.05 on characters.

Where this differs from the paper (docs/qanet.md): the word vectors are the embedded MiniLM's
frozen WordPiece table (384 wide), not GloVe (300); the feed-forward width is a field
(`ffn_dim`, the paper does not give it; d_model by default, as common implementations use);
stochastic depth is off by default (`layer_dropout`); the paper's moving average of the weights is
the trainer's (`optim.ema_decay`, configs/qanet_squad.py:qanet_ema), not the model's.

The Reformer options (the "Inquisition" seed's variants) are all off by default:
`lsh_encoders` (which encoders' self-attention is LSH attention, `model/lsh.py`), `reversible`
(each encoder stack as reversible layers, `model/reversible.py`), `ffn_chunk_size` (the
feed-forward over rows in chunks, `model/memory.py`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, ClassVar

from dil_jax.defaults import CPU_MAX_QUESTION_LEN
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.qanet_inputs import CHAR_VOCAB_SIZE, MAX_CHARS

# The two encoders of QANet that have self-attention, by the names `lsh_encoders` takes.
ENCODERS = ("embedding", "model")
# The model encoder runs three times with shared weights: M0, M1, M2; the start pointer reads
# [M0; M1], the end pointer [M0; M2].
MODEL_PASSES = 3


@dataclasses.dataclass(frozen=True)
class QANetConfig:
    """QANet's shape. Attributes (widths in features):

      vocab_size, word_dim: the frozen word table's rows and width (MiniLM: 30522 x 384).
      char_vocab_size, max_chars: character ids (`qanet_inputs.char_id`) and slots per token.
      char_dim, char_filters, char_kernel: character embedding width, the character CNN's
        output width and kernel (over the characters of one token).
      d_model, num_heads, ffn_dim: the encoders' width, attention heads, feed-forward width.
      embedding_blocks, embedding_convs, embedding_kernel: the embedding encoder's stack.
      model_blocks, model_convs, model_kernel: the model encoder's stack (applied three times
        with shared weights, `MODEL_PASSES`).
      dropout, char_dropout, word_dropout: between layers, on character vectors, on word vectors.
      layer_norm_eps: of every LayerNorm.
      lsh_encoders: () or some of ENCODERS: their self-attention is LSH attention.
      lsh_num_hashes, lsh_bucket_size, lsh_num_buckets, lsh_exclude_self, lsh_seed: as
        `EncoderConfig`'s (docs/long_passages.md, "Long passages").
      reversible: the encoder stacks as reversible layers (needs even conv counts: the block's
        sublayers pair up as (conv, conv), ..., (attention, feed-forward)).
      ffn_chunk_size: 0 = off; else the feed-forward runs over this many rows at a time.
      layer_dropout: stochastic depth (the paper's "layer dropout"): in training, sublayer l of
        an encoder stack's L skips its residual branch with probability (l / L) * layer_dropout
        (the paper: 0.1 at the last, `layer_survival`); 0 = off. Plain stacks only.
      train_word_table: the word table is trained (a parameter) instead of frozen
        (`model.word_table`).
      word_scale: every looked-up word vector is multiplied by it (`word_table.look_up`), so
        that a frozen table of small entries (MiniLM's: std 0.056, against the character CNN's
        O(1) features) enters the projection at the scale of its other inputs; 1 = as stored.
      scan_blocks: a plain stack's blocks run as one `lax.scan` over their params stacked
        [blocks, ...] (the params keep their per-block layout, so an export reads either way):
        the same function, traced and compiled once per stack instead of once per block,
        which cuts the train step's compile time (on a lent GPU a third of a short run went to
        compiling); off by default, the paper's unrolled layout (docs/results/qanet_log.md, "Scanned
        blocks", has the CPU's measured cost of each). Not with stochastic depth (its survival
        rate is a per-block constant).
      max_question_len: the padded length of a question segment `[CLS] q [SEP]` it reads (no
        position table limits it: the positional encoding is a formula); a reading setting,
        kept here as `EncoderConfig` keeps it, so an export records it.
    """

    vocab_size: int = 30522
    word_dim: int = 384
    char_vocab_size: int = CHAR_VOCAB_SIZE
    max_chars: int = MAX_CHARS
    char_dim: int = 64
    char_filters: int = 200
    char_kernel: int = 5
    d_model: int = 128
    num_heads: int = 8
    ffn_dim: int = 128
    embedding_blocks: int = 1
    embedding_convs: int = 4
    embedding_kernel: int = 7
    model_blocks: int = 7
    model_convs: int = 2
    model_kernel: int = 7
    dropout: float = 0.1
    char_dropout: float = 0.05
    word_dropout: float = 0.1
    layer_norm_eps: float = 1e-6
    lsh_encoders: tuple[str, ...] = ()
    lsh_num_hashes: int = 2
    lsh_bucket_size: int = 64
    lsh_num_buckets: int = 0
    lsh_exclude_self: bool = False
    lsh_seed: int = 0
    reversible: bool = False
    ffn_chunk_size: int = 0
    max_question_len: int = CPU_MAX_QUESTION_LEN
    train_word_table: bool = False
    layer_dropout: float = 0.0
    scan_blocks: bool = False
    word_scale: float = 1.0

    # The fields a trained QANet may be read or trained further with other values of
    # (`char_reader.switched_config`): how its attention and feed-forward are computed (LSH,
    # reversible, chunked, scanned: the same params, checked at warm start), its dropout and the
    # question length it reads. Every other field gives the params their meaning (shapes, the
    # word table's scale) and stays as trained.
    RUN_SETTINGS: ClassVar[frozenset[str]] = frozenset({
        "lsh_encoders", "lsh_num_hashes", "lsh_bucket_size", "lsh_num_buckets",
        "lsh_exclude_self", "lsh_seed", "reversible", "ffn_chunk_size", "scan_blocks",
        "dropout", "char_dropout", "word_dropout", "layer_dropout", "max_question_len"})

    def __post_init__(self) -> None:
        if isinstance(self.lsh_encoders, list):  # from JSON
            object.__setattr__(self, "lsh_encoders", tuple(self.lsh_encoders))
        validate_qanet_config(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    # What a passage cache records of a reader (`open_domain.cache.check.reader_cache_key`), under
    # the BERT family's names: the architecture, the blocks each segment runs alone (QANet's
    # fixed split: its embedding encoder) and the width of a cached passage state.
    architecture = "qanet"

    @property
    def num_lower_layers(self) -> int:
        return self.embedding_blocks

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_layers(self) -> int:
        """Block applications per pair: the embedding encoder's (per segment, cached) and the
        model encoder's, MODEL_PASSES times (the "k/l" of a results table)."""
        return self.embedding_blocks + MODEL_PASSES * self.model_blocks

    def cached_state_settings(self) -> dict[str, Any]:
        """The settings besides the params that change a passage's cached state
        (`encode_lower`), those away from their defaults: the word scale, and the LSH settings
        when the embedding encoder uses LSH (part of an open-domain cache's key)."""
        settings: dict[str, Any] = {}
        if self.word_scale != 1.0:
            settings["word_scale"] = self.word_scale
        if "embedding" in self.lsh_encoders:
            settings.update({name: getattr(self, name) for name in (
                "lsh_num_hashes", "lsh_bucket_size", "lsh_num_buckets", "lsh_exclude_self",
                "lsh_seed")}, lsh_encoders="embedding")
        return settings

    def replace(self, **changes: Any) -> QANetConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["lsh_encoders"] = list(self.lsh_encoders)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> QANetConfig:
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown QANetConfig field(s): {unknown}; known: {sorted(known)}")
        return cls(**values)


_POSITIVE = ("vocab_size", "word_dim", "char_vocab_size", "max_chars", "char_dim",
             "char_filters", "char_kernel", "d_model", "num_heads", "ffn_dim", "embedding_blocks",
             "embedding_convs", "embedding_kernel", "model_blocks", "model_convs", "model_kernel",
             "lsh_num_hashes", "lsh_bucket_size")
_NON_NEGATIVE = ("lsh_num_buckets", "lsh_seed", "ffn_chunk_size")
_RATES = ("dropout", "char_dropout", "word_dropout", "layer_dropout")


def layer_survival(sublayer: int, num_sublayers: int, layer_dropout: float) -> float:
    """The probability that sublayer `sublayer` (1-based) of a stack of `num_sublayers` keeps
    its residual branch in training: p_l = 1 - (l / L) (1 - p_L), with p_L = 1 - layer_dropout
    (Yu et al. 2018, section 2.2, after Huang et al. 2016)."""
    return 1.0 - sublayer / num_sublayers * layer_dropout


def check_question_len(value: Any) -> None:
    """ConfigError unless `value` is a question length every reader accepts (`OPTIONS`)."""
    from dil_jax.options import OPTIONS

    bound = OPTIONS["max_question_len"]
    if not bound.accepts(value):
        raise ConfigError(f"max_question_len must be {bound.wanted}, got {value!r}")


def check_word_scale(value: Any) -> None:
    """ConfigError unless `value` is a finite positive number (QANet's and BiDAF's word_scale)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            0 < value < math.inf):
        raise ConfigError(f"word_scale must be a positive number, got {value!r}")


def validate_qanet_config(config: QANetConfig) -> None:
    """Raises ConfigError naming the first invalid field."""
    for name in _POSITIVE + _NON_NEGATIVE:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value < (1 if name in _POSITIVE else 0):
            raise ConfigError(f"{name} must be >= {1 if name in _POSITIVE else 0}, got {value}")
    for name in _RATES:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
            raise ConfigError(f"{name} must be a rate in [0, 1), got {value!r}")
    check_question_len(config.max_question_len)
    check_word_scale(config.word_scale)
    for name in ("lsh_exclude_self", "reversible", "train_word_table", "scan_blocks"):
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(config, name)!r}")
    if config.d_model % config.num_heads:
        raise ConfigError(f"d_model {config.d_model} is not a multiple of num_heads "
                          f"{config.num_heads}")
    for name in ("char_kernel", "embedding_kernel", "model_kernel"):
        if getattr(config, name) % 2 == 0:
            # "SAME" padding of an even kernel is lopsided: a token would see one more
            # neighbour on one side, and masking padding would no longer be symmetric.
            raise ConfigError(f"{name} must be odd, got {getattr(config, name)}")
    unknown = [name for name in config.lsh_encoders if name not in ENCODERS]
    if unknown or len(set(config.lsh_encoders)) != len(config.lsh_encoders):
        raise ConfigError(f"lsh_encoders {list(config.lsh_encoders)}: each of {list(ENCODERS)} "
                          f"at most once")
    buckets = config.lsh_num_buckets
    if buckets > 1 and buckets % 2:
        raise ConfigError(f"lsh_num_buckets must be 0 (derived from the length), 1 or even "
                          f"(angular LSH takes the argmax over [xR; -xR]), got {buckets}")
    if config.reversible and config.layer_dropout:
        raise ConfigError(f"layer_dropout {config.layer_dropout} with reversible stacks: not "
                          "built (a reversible layer would have to skip F or G alike when its "
                          "inputs are recomputed); set one of them to 0 / false")
    if config.scan_blocks and config.layer_dropout:
        raise ConfigError(f"layer_dropout {config.layer_dropout} with scan_blocks: not built "
                          "(each block's survival rate is a constant of its own); set one of "
                          "them to 0 / false")
    if config.reversible:
        odd = [name for name in ("embedding_convs", "model_convs") if getattr(config, name) % 2]
        if odd:
            raise ConfigError(f"reversible QANet pairs each block's sublayers as (conv, conv), "
                              f"..., (attention, feed-forward): {', '.join(odd)} must be even")
