"""Batches of windows of similar real length (`data.length_buckets`), each cut to its bucket.

A training window is padded to `data.max_passage_len` passage tokens, but at 160 tokens only 82% of
the complete SQuAD v1.1 set's passage tokens are real (docs/results/training_log.md, "Making an
epoch cheaper"). With buckets, say "96,128,160", every unit (a window, or a question's group of
windows under shared normalisation) belongs to the smallest bucket that holds its real passage
tokens (a group: its longest window's), every batch draws its units from one bucket, and its passage
arrays are cut to that bucket's length: one compiled step per bucket length, less padding in most
steps. The answer positions need no change (they lie among the real tokens).

The order stays a pure function of (data seed, step), so a resumed run and every process see the
same batches: in epoch e each bucket's units are permuted by the seed (seed, e, bucket), cut into
full batches, and the units that do not fill one move up into the next bucket's pool (they fit
its length); the last bucket's remainder is dropped, as the unbucketed order drops its own. The
number of batches of each bucket depends only on the bucket counts, so an epoch always has the
same steps; the epoch's batches are then shuffled by (seed, e).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from dil_jax.errors import UsageError

# Keys of a training batch whose last axis is the passage's tokens: cut to the bucket length.
PASSAGE_AXIS_KEYS = ("p_ids", "p_mask", "teacher_start_logits", "teacher_end_logits")


def parse_buckets(spec: str, max_passage_len: int) -> tuple[int, ...]:
    """"96,128,160" -> (96, 128, 160): increasing lengths ending at max_passage_len (added when
    left out); "" -> () (no buckets). Raises UsageError naming config.data.length_buckets."""
    if not spec.strip():
        return ()
    try:
        lengths = tuple(int(part) for part in spec.split(","))
    except ValueError:
        lengths = ()
    if not lengths or tuple(sorted(set(lengths))) != lengths or lengths[0] < 1 \
            or lengths[-1] > max_passage_len:
        raise UsageError(f"config.data.length_buckets = {spec!r}: must be increasing passage "
                         f"lengths in tokens, separated by commas, at most "
                         f"config.data.max_passage_len = {max_passage_len} (e.g. '96,128')")
    return lengths if lengths[-1] == max_passage_len else lengths + (max_passage_len,)


def unit_real_lengths(p_mask: np.ndarray, groups: np.ndarray | None,
                      group_valid: np.ndarray | None) -> np.ndarray:
    """Real passage tokens of each unit: [n_windows, Lp] mask -> [num_units] (a group: its
    longest real window's)."""
    real = p_mask.sum(axis=1)
    if groups is None:
        return real
    return np.where(group_valid, real[groups], 0).max(axis=1)


@dataclasses.dataclass(frozen=True, eq=False)
class BucketedOrder:
    """Which units, cut to which passage length, each step of a bucketed run reads."""

    bucket_of_unit: np.ndarray  # [num_units] index into `lengths`
    lengths: tuple[int, ...]  # passage tokens of each bucket, increasing
    units_per_batch: int
    seed: int
    # The last epoch's batches: steps read them in order, so one epoch is planned once.
    _planned: dict = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, real_lengths: np.ndarray, lengths: tuple[int, ...], units_per_batch: int,
              seed: int) -> BucketedOrder:
        bucket = np.searchsorted(np.asarray(lengths), real_lengths, side="left")
        return cls(np.minimum(bucket, len(lengths) - 1), lengths, units_per_batch, seed)

    @functools.cached_property
    def batches_per_bucket(self) -> tuple[int, ...]:
        """Full batches of each bucket in every epoch (the remainders moving up)."""
        carried, batches = 0, []
        for count in np.bincount(self.bucket_of_unit, minlength=len(self.lengths)):
            pool = int(count) + carried
            batches.append(pool // self.units_per_batch)
            carried = pool % self.units_per_batch
        return tuple(batches)

    @property
    def per_epoch(self) -> int:
        return sum(self.batches_per_bucket)

    def epoch_batches(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """[(passage length, units [units_per_batch])] of epoch `epoch`, in visiting order."""
        batches: list[tuple[int, np.ndarray]] = []
        carried = np.zeros(0, np.int64)
        for index, length in enumerate(self.lengths):
            members = np.nonzero(self.bucket_of_unit == index)[0]
            pool = np.concatenate([carried, np.random.default_rng(
                [self.seed, epoch, index]).permutation(members)])
            full = self.batches_per_bucket[index] * self.units_per_batch
            batches += [(length, pool[i:i + self.units_per_batch])
                        for i in range(0, full, self.units_per_batch)]
            carried = pool[full:]
        order = np.random.default_rng([self.seed, epoch]).permutation(len(batches))
        return [batches[i] for i in order]

    def step_units(self, step: int) -> tuple[np.ndarray, int]:
        """(units [units_per_batch], passage length) of global step `step`."""
        if self.per_epoch == 0:
            raise UsageError(f"no bucket of config.data.length_buckets fills one global batch of "
                             f"{self.units_per_batch} units: lower config.batch_size")
        epoch, index = divmod(step, self.per_epoch)
        if epoch not in self._planned:
            self._planned.clear()
            self._planned[epoch] = self.epoch_batches(epoch)
        length, units = self._planned[epoch][index]
        return units, length


def cut_passages(batch: dict[str, np.ndarray], length: int) -> dict[str, np.ndarray]:
    """The batch with every passage-axis array cut to its first `length` tokens."""
    return {key: value[..., :length] if key in PASSAGE_AXIS_KEYS else value
            for key, value in batch.items()}
