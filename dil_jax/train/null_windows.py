"""Training on a share of the answer-less windows (`data.null_window_fraction`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from dil_jax.errors import UsageError
from dil_jax.train.data import Windows


def sample_null_windows(windows: Windows, fraction: float, seed: int) -> Windows:
    """`windows` with only `fraction` of their answer-less labelled windows (a window of a
    labelled question that does not hold its answer: label -1 / -1), chosen by `seed`; every
    answer window, distractor and distillation-only window is kept, in row order.

    A long paragraph's windows mostly lack the answer (23% of the complete SQuAD v1.1 training
    windows at 160 tokens, stride 80); training on a share of them makes an epoch cheaper while
    the reader still learns the null. The subset is fixed for the run (it is part of the data the
    order permutes, so a resume finds the same windows).
    """
    if not 0.0 < fraction <= 1.0:
        raise UsageError(f"config.data.null_window_fraction = {fraction}: must be in (0, 1]")
    if windows.groups is not None:
        raise UsageError("config.data.null_window_fraction < 1 cannot be combined with "
                         "config.loss.shared_norm (a group holds its question's windows)")
    null = np.nonzero((windows.start < 0) & windows.labelled & ~windows.is_distractor)[0]
    keep = np.ones(len(windows), bool)
    if fraction < 1.0 and len(null):
        chosen = np.random.default_rng([seed, len(windows)]).permutation(null)
        keep[chosen[round(fraction * len(null)):]] = False
    rows = np.nonzero(keep)[0]

    def take(values: np.ndarray | None) -> np.ndarray | None:
        return None if values is None else values[rows]

    return dataclasses.replace(
        windows, p_ids=windows.p_ids[rows], p_mask=windows.p_mask[rows],
        question_index=windows.question_index[rows], start=windows.start[rows],
        end=windows.end[rows], is_distractor=windows.is_distractor[rows],
        labelled=windows.labelled[rows], start_candidates=take(windows.start_candidates),
        end_candidates=take(windows.end_candidates))
