"""The passage windows a reader was trained on, as its records keep them: `TrainedWindows`.

A reader reads best the windows it learned from (the bundled readers and the SQuAD configs here:
160-token windows every 80 tokens, where `predict`'s own default is BERT's 384 / 128). So an
export records them, and `predict` reads with them unless told otherwise:
  - `trained_from.json` (beside the params of a `dil-jax train` export or of
    `tools/export_train_step.py`): `"windows": {"max_passage_len": L, "doc_stride": S}`;
  - a Hugging Face export's manifest (the bundled readers): its training config's
    `data.max_passage_len` and `data.doc_stride`.
The question length needs no record here: it is a field of the reader's own config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dil_jax.errors import CheckpointError

WINDOWS_FIELD = "windows"  # its key in trained_from.json


@dataclasses.dataclass(frozen=True)
class TrainedWindows:
    """Passage windows of `max_passage_len` tokens (`passage [SEP]`) starting every
    `doc_stride` tokens (0 < doc_stride < max_passage_len), as a run featurized its data."""

    max_passage_len: int
    doc_stride: int

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], where: str) -> TrainedWindows:
        """The windows of a record holding both fields; CheckpointError naming `where` and the
        field when one is missing or not a window setting."""
        values = {}
        for field in ("max_passage_len", "doc_stride"):
            value = record.get(field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CheckpointError(f"{where}: '{field}' must be a positive integer, got "
                                      f"{value!r}; fix or remove the record (then pass "
                                      "--max-passage-len and --doc-stride)")
            values[field] = value
        if values["doc_stride"] >= values["max_passage_len"]:
            raise CheckpointError(f"{where}: 'doc_stride' {values['doc_stride']} must be smaller "
                                  f"than 'max_passage_len' {values['max_passage_len']}; fix or "
                                  "remove the record")
        return cls(**values)
