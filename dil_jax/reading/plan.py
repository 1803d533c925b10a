"""`ReusePlan`: every exact reuse of the pair program, decided once from a reader's config.

Reading a (question, passage) pair runs the upper blocks k+1..l over `[question ; passage]`
lower states. Some of that work depends on one segment alone, or is never read, and can be
done once or left out without changing a score (docs/architecture.md, "Exact reuse in the pair
program"). Which of those a reader may use follows from its config and two switches of the
caller; the plan records the answers, and the pair program (`reading.upper`, `reading.grid`)
asks it instead of deciding again:

  reads_passage_ids    k = 0: a passage has no question-independent lower state, so pairs
                       read passage ids and embed them themselves
  hoists_projections   0 < k < l and plain upper blocks: the first upper block's q/k/v of a
                       segment can be computed once per segment (`project_upper`)
  span_rows_only       plain upper blocks: the last block computes only `[CLS]` and the
                       passage rows, all the span head reads
  passage_stats        hoisting, and not XLNet: the first upper block's passage-to-passage
                       softmax statistics can be computed once per passage
  trims_padding        not XLNet, no LSH upper block: each chunk of pairs reads only as many
                       tokens as its longest real segments
  reads_kept_tokens    not XLNet: pairs may read only the kept tokens of their passage
                       (sentence prescreening) through the upper blocks

"Plain upper blocks" are post-LayerNorm blocks with full attention above k: reversible blocks
and LSH attention in an upper block break the reuses' arithmetic.
"""

from __future__ import annotations

import dataclasses

from dil_jax.model.delayed import InputError
from dil_jax.model.encoder_config import EncoderConfig

# A side's first-upper-block q/k/v (and the passages' statistics) are computed up front when
# its rows are read by at least this many pairs each on average: projecting every row once then
# costs at most half of projecting inside each pair. The statistics cost one pair's
# passage x passage attention per passage, which each further pair reading it saves.
HOIST_MIN_READS = 2


@dataclasses.dataclass(frozen=True)
class ReusePlan:
    """Which exact reuses pairs of one reader use (see the module docstring for each).

    plain_upper: the upper blocks are post-LayerNorm with full attention, the condition of every
    reuse of them; the inference functions of `reading.upper` refuse the reuses without it."""

    plain_upper: bool
    reads_passage_ids: bool
    hoists_projections: bool
    span_rows_only: bool
    passage_stats: bool
    trims_padding: bool
    reads_kept_tokens: bool
    min_reads: int = HOIST_MIN_READS

    @classmethod
    def for_config(cls, config: EncoderConfig, *, reuse: bool = True,
                   trim_padding: bool = True) -> ReusePlan:
        """The plan of a reader with this config. reuse=False is the reference computation
        (every row of every upper block, full attention in each pair, full-length segments);
        hoisting stays (its outputs are the same either way). trim_padding=False keeps the
        other reuses but reads every segment at its full length."""
        k, layers = config.num_lower_layers, config.num_layers
        lsh_above_k = any(layer >= k for layer in config.lsh_attention_layers)
        plain = not config.reversible and not lsh_above_k
        xlnet = config.architecture == "xlnet"
        hoists = 0 < k < layers and plain
        return cls(
            plain_upper=plain,
            reads_passage_ids=k == 0,
            hoists_projections=hoists,
            span_rows_only=reuse and plain,
            passage_stats=reuse and hoists and not xlnet,
            # XLNet: a question's padding counts in every relative distance. LSH upper
            # blocks: their hash buckets depend on the sequence length.
            trims_padding=reuse and trim_padding and not xlnet and not lsh_above_k,
            # XLNet's upper blocks would renumber the kept tokens' relative distances.
            reads_kept_tokens=not xlnet,
        )

    def projects(self, num_pairs: int, num_rows: int) -> bool:
        """Whether a side of `num_rows` segments read by `num_pairs` pairs gets its q/k/v
        computed once per segment (a speed choice only: the scores are the same)."""
        return self.hoists_projections and num_pairs >= self.min_reads * num_rows

    def projects_passages(self, num_pairs: int, num_passages: int, kept_tokens: bool) -> bool:
        """`projects` for the passage side; never with kept tokens (prescreening), whose pairs
        project only the tokens they keep."""
        return not kept_tokens and self.projects(num_pairs, num_passages)

    def computes_passage_stats(self, num_pairs: int, num_passages: int,
                               kept_tokens: bool) -> bool:
        """Whether the passages' attention statistics are computed for these pairs: by the
        rule of their q/k/v, never with kept tokens (they attend only the kept keys, whose
        statistics are not the whole passage's)."""
        return self.passage_stats and self.projects_passages(num_pairs, num_passages,
                                                             kept_tokens)

    def check_given(self, *, qkv: bool, p_qkv: bool, p_stats: bool, kept_tokens: bool,
                    what: str) -> None:
        """Raises InputError for what this plan cannot read: kept tokens where it reads none,
        q/k/v without hoisting, passage q/k/v or statistics with kept tokens, statistics the plan
        does not use. `what` names the reader's split in the message ("k = 2 of 4 layers")."""
        if kept_tokens and not self.reads_kept_tokens:
            raise InputError("kept-token positions (sentence prescreening) are not supported "
                             "for architecture 'xlnet': its upper blocks would renumber the "
                             "kept tokens' relative distances")
        if qkv and not self.hoists_projections:
            raise InputError(f"q/k/v given, but {what} has no lower state to project them "
                             f"from (0 < k < l needed)")
        if p_qkv and kept_tokens:
            raise InputError("p_qkv cannot be combined with positions: kept tokens are "
                             "projected inside the pair program")
        if p_stats and not self.passage_stats:
            raise InputError(f"p_stats given, but this reader does not use them "
                             f"(span_rows_only={self.span_rows_only}, {what}; 0 < k < l needed)")
        if p_stats and kept_tokens:
            raise InputError("p_stats cannot be combined with positions: kept tokens attend "
                             "only the kept keys, not the whole passage's")

