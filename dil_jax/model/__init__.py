"""The delayed-interaction reader: Flax modules, the pure-functional API and the pair grid.

    attention.py
                self-attention (`SelfAttention`) and the softmax-part arithmetic that lets a pair
                reuse its passage's cached attention statistics (`PassageAttentionStats`,
                `passage_attention_stats`)
    layers.py   the layers a reader stacks: activations, `Embeddings`, the post-LayerNorm `Block`
    modules.py  the reader Flax module: the stack of blocks and the span head
                (`SpanReaderModule` with `encode_lower` / `project_upper` / `encode_upper`)
    delayed.py  `DelayedInteractionModel`: params in, arrays out — `encode_lower` (blocks 1..k on
                one segment), `project_upper` (the first upper block's q/k/v of one segment),
                `encode_upper` (blocks k+1..l over [question; passage] and the span head); the
                length rule `check_segment_lengths`
    grid.py     `PairGrid`: a question x passage grid on all devices (lower states once per
                question and per passage, pairs in fixed-size chunks on a 1-D mesh, the pair
                program's exact reuses: `passage_attention_stats`, the last block's rows);
                `passage_side` (what pairs read of a passage, for any k) and `read_pairs`
    pairs.py    what pairs read from the config alone (`reads_passage_ids`,
                `hoists_projections`), chunk token widths (`kept_positions`, `chunk_width`);
                `SpanScores`, the four score arrays of any set of pairs

    lsh.py, memory.py, reversible.py
                the long-passage options (docs/architecture.md, "Long passages"): Reformer
                LSH attention, chunked row-wise maps and remat policies, reversible layers

Dependencies run one way: lsh <- attention; attention, memory <- layers; attention, layers,
memory, reversible <- modules <- delayed <- grid; modules <- pairs <- grid.
"""

from dil_jax.model.attention import PassageAttentionStats
from dil_jax.model.delayed import (
    DelayedInteractionModel,
    InputError,
    Params,
    check_segment_lengths,
    with_num_lower_layers,
)
from dil_jax.model.grid import PairGrid
from dil_jax.model.modules import (
    PASSAGE_SEGMENT,
    QUESTION_SEGMENT,
    ReaderOutput,
    SpanReaderModule,
)
from dil_jax.model.pairs import SpanScores, reads_passage_ids

__all__ = [
    "PASSAGE_SEGMENT", "QUESTION_SEGMENT", "DelayedInteractionModel", "InputError", "PairGrid",
    "Params", "PassageAttentionStats", "ReaderOutput", "SpanReaderModule", "SpanScores",
    "check_segment_lengths", "reads_passage_ids", "with_num_lower_layers",
]
