"""Reading (question, passage) pairs at inference with a delayed-interaction reader.

    plan.py    `ReusePlan`: every exact reuse of the pair program, decided once from the
               reader's config (which passage side pairs read, q/k/v per segment, the passages'
               attention statistics, the last block's rows, chunks cut to their real tokens)
    upper.py   the upper blocks at inference over a `DelayedInteractionModel`: `project_upper`,
               `passage_attention_stats`, `read_upper` (params in, arrays out; reuses checked
               against the plan)
    pairs.py   host-side parts: kept-token positions, chunk widths, `SpanScores` (the span and
               null scores of any set of pairs)
    grid.py    `PairGrid`: lower states once per question and per passage, pairs in fixed-size
               chunks on all devices of a 1-D mesh (`read_pairs`, `read_grid`); `MeshGrid`,
               what every grid shares
    char_grid.py  `CharPairGrid`: the same for QANet / BiDAF (their fixed split, characters)

Dependencies run one way: dil_jax.model <- plan <- upper <- grid <- char_grid; pairs <- grid.
"""
