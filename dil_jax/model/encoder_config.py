"""Encoder configuration shared by BERT, ALBERT, DistilBERT, RoBERTa, XLM-RoBERTa, ELECTRA and
XLNet (QANet's and BiDAF's beside it: `model/qanet_config.py`, `model/bidaf_config.py`).

One frozen dataclass describes every supported architecture; it is hashable so it can be a Flax
module attribute and a static argument of `jax.jit`. `num_lower_layers` (the paper's `k`) is part of
the config because it decides where the computation splits, but not what the parameters are: the
same params serve every `k`, so `dataclasses.replace(config, num_lower_layers=k)` is all it takes
to read with another split.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from dil_jax.defaults import MAX_QUESTION_LEN
from dil_jax.errors import DilJaxError, UsageError

ARCHITECTURES = ("bert", "albert", "distilbert", "roberta", "xlm-roberta", "electra", "xlnet")
# RoBERTa-style embeddings: positions numbered from padding_idx + 1 (Hugging Face's
# `create_position_ids_from_input_ids`), and one token type for both segments.
ROBERTA_FAMILY = ("roberta", "xlm-roberta")
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ATTENTION_FORMS = ("auto", "batched", "per_example")
# What a dense layer's matmul reads (`matmul_dtype`): "bfloat16" rounds its two operands to
# bfloat16 and accumulates in float32 (the rest of the model stays in float32).
MATMUL_DTYPES = ("float32", "bfloat16")
# `remat_policy` names -> the `jax.checkpoint_policies` entry they select ("none": no remat;
# "full": save nothing, recompute the whole block in the backward pass).
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")


class ConfigError(DilJaxError, ValueError):
    """A configuration value is invalid; the message names the field and the value."""


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """Hyper-parameters of a delayed-interaction reader.

    Attributes:
      architecture: one of ARCHITECTURES (Hugging Face model_type names; "xlnet" is
        `model/xlnet.py`).
      vocab_size: WordPiece/SentencePiece vocabulary size.
      hidden_size: width of the transformer blocks.
      num_layers: `l`, the number of blocks applied (ALBERT applies its shared block `l` times).
      num_heads: attention heads per block.
      intermediate_size: width of the feed-forward layer.
      max_position_embeddings: rows of the learned position table (XLNet, whose positions
        are relative sinusoids, has none: there it is the longest sequence accepted).
      type_vocab_size: rows of the token-type table (0 for DistilBERT and XLNet, which have
        none; 1 for RoBERTa / XLM-RoBERTa, whose two segments both take type 0).
      embedding_size: embedding width; differs from hidden_size only for ALBERT and ELECTRA
        (projected to hidden_size before the first block, `projects_embeddings`).
      num_hidden_groups: ALBERT parameter groups; block `i` uses group `i * groups // l`.
      hidden_act: feed-forward activation, named as in Hugging Face configs.
      layer_norm_eps: LayerNorm epsilon.
      hidden_dropout: dropout on block outputs and embeddings.
      attention_dropout: dropout on attention probabilities.
      initializer_range: stddev of the truncated-normal init of fresh weights (e.g. the QA head).
      pad_token_id: id of the padding token (RoBERTa's `padding_idx`: its positions start at
        pad_token_id + 1, `first_position`).
      num_lower_layers: `k`, blocks run on question and passage separately (0..num_layers).
      max_question_len: fixed padded length of the question segment `[CLS] q [SEP]`.
      dtype: compute dtype name ("float32" or "bfloat16"); params always stay float32.
      passage_position_offset: with k > 0, the position of a passage's first token (0: numbered
        from 0, the papers' convention). A constant keeps the passage question-independent (its
        lower states stay cacheable) while moving it to where a full reader's passages sit,
        after a typical question; a reader warm-started from a full one then starts closer to
        it. Ignored at k = 0 (positions follow the real question). Saved configs omit it at 0.
      attention_form: how inference attention is traced: "per_example" loops it over the batch,
        "batched" is one batched op, "auto" picks per_example on CPU and batched elsewhere (see
        `dil_jax.model.attention.attends_per_example`). The same operations either way, so not a
        hyper-parameter: `to_dict` leaves the default out and saved configs stay as they were.
      matmul_dtype: what the dense layers' matmuls read: "float32", or "bfloat16" (inference
        only: both operands rounded to bfloat16, products accumulated in float32, everything
        else float32; the kernels are held in bfloat16, `matmul_params`). Where the CPU
        multiplies bfloat16 natively (AVX512-BF16, AMX) that is the fastest dot XLA:CPU has;
        where it does not, it is slower (`dil_jax.readers.matmul` measures which). Not a
        hyper-parameter: `to_dict` leaves the default out.

    Long passages (docs/long_passages.md, "Long passages"); every field is off by default and
    `to_dict` leaves it out then, so saved configs are unchanged:
      ffn_chunk_size: > 0 runs each block's feed-forward over the sequence in chunks of this
        many rows (exact: the FFN is row-wise); 0 = in one piece.
      lsh_attention_layers: the 0-based layers whose attention is Reformer LSH attention
        (`dil_jax.model.lsh`), e.g. the passage's lower blocks; () = full attention everywhere.
      lsh_num_hashes: hash rounds of LSH attention.
      lsh_bucket_size: tokens per chunk of the sorted sequence (Reformer's bucket size).
      lsh_num_buckets: hash buckets; 0 = derived from the length (one per bucket_size tokens,
        rounded up to an even count).
      lsh_exclude_self: Reformer's rule that a token attends to itself only when nothing else
        is available (for shared-QK models); False keeps the self term, as pretrained readers'
        full attention has it.
      lsh_seed: the seed of the hash rotations when no "lsh" rng is passed (inference).
      remat_policy: `jax.checkpoint` policy of every block in training ("none" = no remat).
      reversible: RevNet blocks (pre-LayerNorm, two residual streams, activations recomputed
        from the outputs in the backward pass); a different function than the post-LayerNorm
        blocks, so for readers trained from scratch only (pretrained checkpoints are refused).
    """

    architecture: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    embedding_size: int = 768
    num_hidden_groups: int = 1
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    initializer_range: float = 0.02
    pad_token_id: int = 0
    num_lower_layers: int = 0
    max_question_len: int = MAX_QUESTION_LEN
    dtype: str = "float32"
    attention_form: str = "auto"
    matmul_dtype: str = "float32"
    passage_position_offset: int = 0
    ffn_chunk_size: int = 0
    lsh_attention_layers: tuple[int, ...] = ()
    lsh_num_hashes: int = 2
    lsh_bucket_size: int = 64
    lsh_num_buckets: int = 0
    lsh_exclude_self: bool = False
    lsh_seed: int = 0
    remat_policy: str = "none"
    reversible: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.lsh_attention_layers, list):
            # JSON has no tuples; a tuple keeps the config hashable (a jit static argument).
            object.__setattr__(self, "lsh_attention_layers", tuple(self.lsh_attention_layers))
        check_encoder_config(self)

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def first_position(self) -> int:
        """Position id of a sequence's first token: 0, or padding_idx + 1 for RoBERTa and
        XLM-RoBERTa, whose Hugging Face embeddings number the non-pad tokens of a sequence
        padding_idx + 1, padding_idx + 2, ... (cumsum of the mask + padding_idx)."""
        return self.pad_token_id + 1 if self.architecture in ROBERTA_FAMILY else 0

    @property
    def num_positions(self) -> int:
        """How many consecutive positions a sequence can use: the rows of the position table
        from `first_position` on (RoBERTa-base: 514 rows, 512 positions)."""
        return self.max_position_embeddings - self.first_position

    @property
    def segment_token_types(self) -> bool:
        """Whether the segment (question 0, passage 1) is the token type id. RoBERTa and
        XLM-RoBERTa give both segments type 0 (their tokenizers do; the table has one row),
        DistilBERT has no table: their segments are told apart by position restart alone.
        XLNet has no table either: its segment ids feed relative segment encodings
        (`model/xlnet.py`)."""
        return self.architecture not in ROBERTA_FAMILY and self.type_vocab_size > 0

    @property
    def projects_embeddings(self) -> bool:
        """Whether an E -> H projection follows the embeddings: ALBERT always (transformers'
        `embedding_hidden_mapping_in`, even when E == H), ELECTRA when E != H
        (`embeddings_project`)."""
        return self.architecture == "albert" or (
            self.architecture == "electra" and self.embedding_size != self.hidden_size)

    def positions_text(self) -> str:
        """How many positions a sequence may use, named for error messages."""
        if not self.first_position:
            return f"max_position_embeddings {self.max_position_embeddings}"
        return (f"{self.num_positions} positions (max_position_embeddings "
                f"{self.max_position_embeddings} less pad_token_id + 1 = {self.first_position})")

    @property
    def shares_block_weights(self) -> bool:
        """ALBERT applies a few parameter groups many times."""
        return self.architecture == "albert"

    def replace(self, **changes: Any) -> EncoderConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON values; attention_form only when not "auto", so that
        encoder_config.json and the records written before the field existed are unchanged."""
        values = dataclasses.asdict(self)
        if values["attention_form"] == "auto":
            del values["attention_form"]
        if values["matmul_dtype"] == "float32":
            del values["matmul_dtype"]
        if values["passage_position_offset"] == 0:
            del values["passage_position_offset"]
        for name, default in LONG_PASSAGE_DEFAULTS.items():
            if values[name] == default:
                del values[name]
        if "lsh_attention_layers" in values:
            values["lsh_attention_layers"] = list(values["lsh_attention_layers"])
        return values

    @property
    def uses_lsh(self) -> bool:
        return bool(self.lsh_attention_layers)

    def cached_state_settings(self) -> dict[str, Any]:
        """The settings besides the params that change a passage's cached lower state (part of
        an open-domain cache's key, as `QANetConfig.cached_state_settings`): the LSH settings
        when a lower block (0..k-1) uses LSH attention, else none (so existing caches keep
        their keys)."""
        lower = [layer for layer in self.lsh_attention_layers if layer < self.num_lower_layers]
        if not lower:
            return {}
        return {"lsh_attention_layers": lower, **{name: getattr(self, name) for name in (
            "lsh_num_hashes", "lsh_bucket_size", "lsh_num_buckets", "lsh_exclude_self",
            "lsh_seed")}}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EncoderConfig:
        if not isinstance(values, dict):
            raise ConfigError(f"an EncoderConfig is a JSON object of fields, got "
                              f"{type(values).__name__}")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown EncoderConfig field(s): {unknown}; known: {sorted(known)}")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ReaderOverrides:
    """EncoderConfig fields a load sets over a checkpoint's own config: how a reader reads (its
    split k, question length, compute dtype, dropout, long-passage options), never what its
    params are, so the same params serve every value. None keeps the checkpoint's own.

    A typed value rather than `**kwargs`, so that k and the rest can be followed from the flag
    or the training config that sets them to the config the model reads; `config_of` sets them
    over a checkpoint's fields, the one place a reader's config is built.
    """

    num_lower_layers: int | None = None
    max_question_len: int | None = None
    dtype: str | None = None
    passage_position_offset: int | None = None
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    ffn_chunk_size: int | None = None
    lsh_attention_layers: tuple[int, ...] | None = None
    lsh_num_hashes: int | None = None
    lsh_bucket_size: int | None = None
    remat_policy: str | None = None
    reversible: bool | None = None

    def fields(self) -> dict[str, Any]:
        """The fields set (not None), by their EncoderConfig names."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) is not None}

    def config_of(self, values: dict[str, Any]) -> EncoderConfig:
        """The EncoderConfig of a JSON object of its fields (a checkpoint's
        `encoder_config.json`, the fields a Hugging Face config maps to, a training config's
        `model.encoder`) with these overrides set over them (ConfigError for a bad one)."""
        return EncoderConfig.from_dict({**values, **self.fields()})

    def over(self, under: ReaderOverrides) -> ReaderOverrides:
        """These overrides where set, `under`'s elsewhere (a command's k over the split a
        manifest records)."""
        return dataclasses.replace(under, **self.fields())


# A checkpoint's config read as it is: every default of an `overrides` parameter.
NO_OVERRIDES = ReaderOverrides()


# The LSH layer spec naming the passage's lower blocks, whatever k is (training's
# model.lsh_attention_layers and predict's --lsh-layers both take it).
LOWER_BLOCKS = "lower"


def lsh_layers_of(spec: str | Sequence[int], num_lower_layers: int,
                  source: str = "lsh_attention_layers") -> tuple[int, ...]:
    """The 0-based LSH attention layers a spec names: "lower" -> the lower blocks 0..k-1 (k =
    num_lower_layers), "" -> none, "0,2" or a sequence of ints -> those layers as given (the
    EncoderConfig checks them against num_layers). `source` (a config key or a flag) names the
    setting in the UsageError for "lower" at k = 0, where there are no lower blocks."""
    if spec == LOWER_BLOCKS:
        if not num_lower_layers:
            raise UsageError(f"{source} = {LOWER_BLOCKS!r} with k = 0: the reader has no lower "
                             "blocks; give k > 0 or name the layers instead")
        return tuple(range(num_lower_layers))
    if isinstance(spec, str):
        return tuple(int(layer) for layer in spec.split(",")) if spec.strip() else ()
    return tuple(spec)


# The long-passage fields and their defaults (off): `to_dict` omits them at these values.
LONG_PASSAGE_DEFAULTS: dict[str, Any] = {
    "ffn_chunk_size": 0, "lsh_attention_layers": (), "lsh_num_hashes": 2,
    "lsh_bucket_size": 64, "lsh_num_buckets": 0, "lsh_exclude_self": False, "lsh_seed": 0,
    "remat_policy": "none", "reversible": False}

_INT_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "embedding_size",
               "num_hidden_groups", "pad_token_id", "num_lower_layers", "max_question_len",
               "passage_position_offset", "ffn_chunk_size", "lsh_num_hashes",
               "lsh_bucket_size", "lsh_num_buckets", "lsh_seed")
_FLOAT_FIELDS = ("layer_norm_eps", "hidden_dropout", "attention_dropout", "initializer_range")
_STR_FIELDS = ("architecture", "hidden_act", "dtype", "attention_form", "matmul_dtype",
               "remat_policy")
_BOOL_FIELDS = ("lsh_exclude_self", "reversible")


def _check_types(config: EncoderConfig) -> None:
    """Why: configs come from JSON files (config.json, encoder_config.json); a quoted number or
    a null would otherwise fail later as a TypeError deep in a comparison or in JAX."""
    for name in _INT_FIELDS:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    for name in _FLOAT_FIELDS:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(f"{name} must be a number, got {value!r}")
    for name in _STR_FIELDS:
        if not isinstance(getattr(config, name), str):
            raise ConfigError(f"{name} must be a string, got {getattr(config, name)!r}")
    for name in _BOOL_FIELDS:
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(config, name)!r}")
    layers = config.lsh_attention_layers
    if not isinstance(layers, tuple) or any(
            isinstance(layer, bool) or not isinstance(layer, numbers.Integral) for layer in layers):
        raise ConfigError(f"lsh_attention_layers must be a list of layer indices, got {layers!r}")


def _validate_long_passages(config: EncoderConfig) -> None:
    """The long-passage fields (`ffn_chunk_size`, `lsh_*`, `remat_policy`, `reversible`)."""
    if config.ffn_chunk_size < 0:
        raise ConfigError(f"ffn_chunk_size must be >= 0 (0 = unchunked), got "
                          f"{config.ffn_chunk_size}")
    layers = config.lsh_attention_layers
    bad = [layer for layer in layers if not 0 <= layer < config.num_layers]
    if bad:
        raise ConfigError(f"lsh_attention_layers {list(layers)}: {bad} not in "
                          f"0..{config.num_layers - 1} (num_layers - 1)")
    if len(set(layers)) != len(layers):
        raise ConfigError(f"lsh_attention_layers {list(layers)} names a layer twice")
    for name in ("lsh_num_hashes", "lsh_bucket_size"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
    buckets = config.lsh_num_buckets
    if buckets < 0 or (buckets > 1 and buckets % 2):
        raise ConfigError(f"lsh_num_buckets must be 0 (derived from the length), 1 or even "
                          f"(angular LSH takes the argmax over [xR; -xR]), got {buckets}")
    if config.remat_policy not in REMAT_POLICIES:
        raise ConfigError(f"unknown remat_policy {config.remat_policy!r}; supported: "
                          f"{list(REMAT_POLICIES)}")
    if config.architecture == "xlnet":
        switched_on = [name for name in ("ffn_chunk_size", "lsh_attention_layers",
                                         "remat_policy", "reversible")
                       if getattr(config, name) != LONG_PASSAGE_DEFAULTS[name]]
        if switched_on:
            raise ConfigError(f"{', '.join(switched_on)}: not implemented for architecture "
                              f"'xlnet' (its relative-attention blocks, model/xlnet.py, have "
                              f"none of the long-passage options)")
    if config.reversible and config.remat_policy != "none":
        raise ConfigError(f"reversible blocks recompute their activations themselves: "
                          f"remat_policy must be 'none' with reversible, got "
                          f"{config.remat_policy!r}")


def check_encoder_config(config: EncoderConfig) -> None:
    """Raises ConfigError naming the first invalid field."""
    _check_types(config)
    _validate_long_passages(config)
    if config.architecture not in ARCHITECTURES:
        raise ConfigError(
            f"unknown architecture {config.architecture!r}; supported: {list(ARCHITECTURES)}"
        )
    if config.hidden_act not in ACTIVATIONS:
        raise ConfigError(f"unsupported hidden_act {config.hidden_act!r}; supported: {ACTIVATIONS}")
    if config.dtype not in DTYPES:
        raise ConfigError(f"unsupported dtype {config.dtype!r}; supported: {list(DTYPES)}")
    if config.matmul_dtype not in MATMUL_DTYPES:
        raise ConfigError(f"unsupported matmul_dtype {config.matmul_dtype!r}; supported: "
                          f"{list(MATMUL_DTYPES)}")
    if config.attention_form not in ATTENTION_FORMS:
        raise ConfigError(f"unknown attention_form {config.attention_form!r}; supported: "
                          f"{list(ATTENTION_FORMS)}")
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings", "embedding_size", "num_hidden_groups",
                 "max_question_len"):
        if getattr(config, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(config, name)}")
    if config.hidden_size % config.num_heads:
        raise ConfigError(
            f"hidden_size {config.hidden_size} is not a multiple of num_heads {config.num_heads}"
        )
    if not 0 <= config.num_lower_layers <= config.num_layers:
        raise ConfigError(
            f"num_lower_layers (k) must be in 0..{config.num_layers} (num_layers), "
            f"got {config.num_lower_layers}"
        )
    if config.architecture == "albert" and config.num_layers % config.num_hidden_groups:
        raise ConfigError(
            f"ALBERT num_layers {config.num_layers} is not a multiple of num_hidden_groups "
            f"{config.num_hidden_groups}"
        )
    if (config.architecture not in ("albert", "electra")
            and config.embedding_size != config.hidden_size):
        raise ConfigError(
            f"embedding_size {config.embedding_size} differs from hidden_size "
            f"{config.hidden_size}; only ALBERT and ELECTRA factorize their embeddings "
            f"(architecture {config.architecture!r})"
        )
    if config.architecture == "distilbert" and config.type_vocab_size != 0:
        raise ConfigError("DistilBERT has no token-type embeddings: type_vocab_size must be 0")
    if config.architecture == "xlnet":
        _validate_xlnet(config)
    elif config.architecture in ROBERTA_FAMILY:
        if config.type_vocab_size < 1:
            raise ConfigError(f"{config.architecture} needs a token-type table (type_vocab_size"
                              f" >= 1; both segments take type 0), got {config.type_vocab_size}")
    elif config.architecture != "distilbert" and config.type_vocab_size < 2:
        raise ConfigError(
            f"type_vocab_size must be >= 2 (question 0, passage 1), got {config.type_vocab_size}"
        )
    if not 0 <= config.pad_token_id < config.vocab_size:
        raise ConfigError(f"pad_token_id must be in 0..{config.vocab_size - 1} (vocab_size - 1), "
                          f"got {config.pad_token_id}")
    if config.num_positions < 2:
        raise ConfigError(f"{config.positions_text()}: a reader needs at least 2")
    if not 0 <= config.passage_position_offset < config.num_positions:
        raise ConfigError(
            f"passage_position_offset must be in 0..{config.num_positions - 1} "
            f"({config.positions_text()}, less 1), got {config.passage_position_offset}")
    if config.max_question_len > config.num_positions:
        raise ConfigError(
            f"max_question_len {config.max_question_len} exceeds {config.positions_text()}"
        )


def _validate_xlnet(config: EncoderConfig) -> None:
    """XLNet has relative segment encodings instead of a token-type table, and relative
    positions, which a passage offset cannot move (it cancels in every distance)."""
    if config.type_vocab_size != 0:
        raise ConfigError("XLNet has no token-type embeddings (relative segment encodings "
                          f"instead): type_vocab_size must be 0, got {config.type_vocab_size}")
    if config.passage_position_offset != 0:
        raise ConfigError("passage_position_offset has no meaning for architecture 'xlnet' "
                          "(relative positions: an offset cancels); it must be 0, got "
                          f"{config.passage_position_offset}")
