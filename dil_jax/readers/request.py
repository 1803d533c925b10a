"""A reader asked for, and loading it: `ReaderRequest`, the one entrance of commands and server.

    request = ReaderRequest(None, k=2, max_question_len=32).resolved()   # the bundled delayed one
    reader = load_requested(request)

A request holds what a user asks a reader by: its checkpoint (a folder, "default", a hub id, or
None for the bundled fine-tuned reader of its role), k, the question length, the tokenizer and
the compute dtype, and the flags that gave them, so a refusal names what the user typed. (The
passage-cache storage a reader expects of an index is the open domain's to check, above this
package: `OpenDomainIndex.open_cache`.) `resolved` names the
checkpoint once (the bundled folder of `defaults.default_reader_role`, or the raw embedded
MiniLM, said loudly, where this install bundles none): every later use (loading, progress and
results records, messages) sees that one path. `load_requested` loads it (`load_reader`) and
turns a k a QANet / BiDAF cannot read into a UsageError naming those flags. Frozen: a command
makes its requests from its flags once, and never writes a resolved value back into them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection

from dil_jax.errors import UsageError
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.readers.loading import load_reader
from dil_jax.readers.protocol import FixedSplitError, Reader

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ReaderRequest:
    """A reader asked for.

    checkpoint: a dil_jax or Hugging Face folder, a QANet / BiDAF export, "default" (the raw
    embedded MiniLM, QA head untrained) or a hub id; None: the bundled reader of its role
    (`resolved`). k, max_question_len, tokenizer: as `load_reader` takes them (None: the
    checkpoint's own); dtype: the compute dtype ("float32", "bfloat16"; None: the
    checkpoint's own). checkpoint_flag, k_flag: the flags that gave the checkpoint and k, named
    in messages (k_flag None: k is implied by checkpoint_flag, as a server's full reader is
    read at k = 0); fix: what to do instead of another k than a fixed split (None: pass k_flag
    with the reader's split).
    """

    checkpoint: str | None = None
    k: int | None = None
    max_question_len: int | None = None
    tokenizer: str | None = None
    dtype: str | None = None
    checkpoint_flag: str = "--checkpoint"
    k_flag: str | None = "--k"
    fix: str | None = None

    def resolved(self, index_ks: Collection[int] = ()) -> ReaderRequest:
        """The same request with its checkpoint named: as given, else the bundled reader of
        its role (`defaults.default_reader_role` of its k; without a k, the delayed one when
        an index holds only its cache, `index_ks` being the k of each cache an index holds)."""
        if self.checkpoint is not None:
            return self
        return dataclasses.replace(self, checkpoint=bundled_or_embedded(self.role(index_ks)))

    def role(self, index_ks: Collection[int] = ()) -> str:
        """Which bundled reader ("full" or "delayed") answers this request without a
        checkpoint (`defaults.default_reader_role`)."""
        from dil_jax.checkpoints.resolved import resolve_reader_checkpoint
        from dil_jax.defaults import bundled_reader, default_reader_role

        delayed_k = None
        if self.k is None and index_ks:
            delayed = bundled_reader("delayed")
            delayed_k = (resolve_reader_checkpoint(delayed).trained_k if delayed is not None
                         else None)
        return default_reader_role(self.k, index_ks, delayed_k)


def bundled_or_embedded(role: str) -> str:
    """The bundled reader of this role; the raw embedded MiniLM, said loudly, without one."""
    from dil_jax.defaults import bundled_reader

    folder = bundled_reader(role)
    if folder is None:
        log.warning("no bundled %s reader in this install: using the raw embedded MiniLM, "
                    "whose QA head is UNTRAINED; answers are arbitrary spans (pass "
                    "--checkpoint)", role)
        return "default"
    return str(folder)


def load_requested(request: ReaderRequest) -> Reader:
    """The reader of a request (its checkpoint named first: `ReaderRequest.resolved`), of
    either family (`load_reader`). Another k than a QANet / BiDAF's fixed split is a UsageError
    naming the request's flags."""
    request = request.resolved()
    try:
        return load_reader(request.checkpoint, request.k, request.max_question_len,
                           request.tokenizer, overrides=ReaderOverrides(dtype=request.dtype))
    except FixedSplitError as error:
        asked = (f"{request.k_flag} {request.k} with {request.checkpoint_flag} "
                 f"{request.checkpoint}" if request.k_flag
                 else f"{request.checkpoint_flag} {request.checkpoint}, read at k = {request.k}")
        instead = request.fix or f"pass {request.k_flag} {error.split}"
        raise UsageError(f"{asked}: a {error.kind} reader's split is fixed (its passages' "
                         f"cached side is its {error.side}, k = {error.split}); {instead}"
                         ) from None
