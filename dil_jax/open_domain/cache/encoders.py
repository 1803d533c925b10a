"""What a passage cache stores for a reader: its `StatesEncoder`, for every reader kind.

    encode = passage_encoder(reader, batch_size, window_texts=index.window_texts)
    states = encode(WindowBatch.of(rows, ids, mask, offsets))      # [n, p_len, hidden]

The BERT family: `encode_lower` of the windows' ids (None at k = 0: a passage's positions follow
the question, so the cache holds its tokens only). QANet / BiDAF: `encode_lower` of the ids and
each token's characters, read from the window's passage text through its offsets (as training and
`predict` read them, `model.qanet_inputs.token_characters`): the text comes from the index
(`window_texts`), by the windows' index rows. Both run on this process's devices only
(`cache.reuse.local_grid`), so a row's values do not depend on how a sharded build was split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dil_jax.open_domain.cache.reuse import local_grid
from dil_jax.open_domain.cache.store import StatesEncoder, WindowBatch
from dil_jax.reading.plan import ReusePlan

if TYPE_CHECKING:
    from dil_jax.checkpoints.readers import Reader

# window rows [n] -> the text of each window's passage, in order (`OpenDomainIndex.window_texts`)
WindowTexts = Callable[[np.ndarray], Sequence[str]]


def passage_encoder(reader: Reader, batch_size: int = 32,
                    window_texts: WindowTexts | None = None) -> StatesEncoder | None:
    """The encoder of `reader`'s cache (module docstring): batch_size rows per device; None
    when the cache holds no states (k = 0). window_texts is required for a reader that reads
    characters (QANet, BiDAF)."""
    if reader.is_char_reader:
        return _char_encoder(reader, batch_size, window_texts)
    if ReusePlan.of(reader.config).reads_passage_ids:
        return None
    grid = local_grid(reader.model, batch_size)
    return lambda windows: np.asarray(grid.encode_passages(reader.params, windows.ids,
                                                           windows.mask))


def _char_encoder(reader: Reader, batch_size: int, window_texts: WindowTexts | None
                  ) -> StatesEncoder:
    from dil_jax.model.qanet_inputs import QANetSegment, token_characters

    if window_texts is None:
        raise ValueError(f"a {reader.model.kind} reader reads characters: its cache encoder "
                         "needs the windows' passage texts (window_texts)")
    grid = local_grid(reader.model, batch_size)
    max_chars = reader.config.max_chars

    def encode(windows: WindowBatch) -> np.ndarray:
        texts = list(window_texts(windows.rows))
        chars = token_characters(texts, windows.offsets, windows.mask, max_chars)
        segment = QANetSegment(windows.ids, chars, windows.mask)
        return np.asarray(grid.encode_passages(reader.params, segment))

    return encode
