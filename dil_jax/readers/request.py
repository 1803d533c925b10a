"""A reader asked for, and loading it: `ReaderRequest`, the one entrance of commands and server.

    request = ReaderRequest(None, k=2, max_question_len=32).resolved()   # the bundled delayed one
    reader = load_requested(request)

A request holds what a user asks a reader by: its checkpoint (a folder, "default", a hub id, or
None for the bundled fine-tuned reader of its role), k, the question length, the tokenizer and
the compute dtype, and the flags that gave them, so a refusal names what the user typed. (The
passage-cache storage a reader expects of an index is the open domain's to check, above this
package: `OpenDomainIndex.open_cache`.) `resolved` names the checkpoint once, by the one rule
for a reader not given (`ask`, `index`, `odqa-eval`, `demo`, `serve`): the bundled reader of its
role (`defaults.default_reader_role`, or the role the command reads it as), else the raw
embedded MiniLM, said loudly (read at `defaults.EMBEDDED_DELAYED_K` as a delayed reader),
or a refusal where an untrained head must not answer (a server). Every later use (loading,
progress and results records, messages) sees that one path. `load_requested` loads it
(`load_reader`) and turns a k a QANet / BiDAF cannot read into a UsageError naming those flags.
Frozen: a command makes its requests from its flags once, and never writes a resolved value
back into them.
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
    (`resolved`): `bundled` ("full", "delayed"; None: the one of its k) and, without one in
    this install, the raw embedded MiniLM where `embedded_fallback`, else a UsageError.
    k, max_question_len, tokenizer: as `load_reader` takes them (None: the checkpoint's own);
    dtype: the compute dtype ("float32", "bfloat16"; None: the checkpoint's own);
    matmul_dtype: what its dense matmuls read, `readers.matmul.MATMUL_CHOICES` ("auto":
    measured at load);
    require_qa_head: refuse a checkpoint without a trained QA head (`UntrainedHeadError`:
    `predict`'s answers must mean something). checkpoint_flag, k_flag: the flags that gave the
    checkpoint and k, named in messages (k_flag None: k is implied by checkpoint_flag, as a
    server's full reader is read at k = 0); fix: what to do instead of another k than a fixed
    split (None: pass k_flag with the reader's split).
    """

    checkpoint: str | None = None
    k: int | None = None
    max_question_len: int | None = None
    tokenizer: str | None = None
    dtype: str | None = None
    matmul_dtype: str = "float32"
    require_qa_head: bool = False
    bundled: str | None = None
    embedded_fallback: bool = True
    checkpoint_flag: str = "--checkpoint"
    k_flag: str | None = "--k"
    fix: str | None = None

    def resolved(self, index_ks: Collection[int] = ()) -> ReaderRequest:
        """The same request with its checkpoint named: as given, else the bundled reader of
        its role (`role`; `index_ks` being the k of each cache an index holds), else the raw
        embedded MiniLM, said loudly (as a delayed reader without a k: at
        `defaults.EMBEDDED_DELAYED_K`, since it records no split), or, without
        `embedded_fallback`, a UsageError naming `checkpoint_flag`."""
        from dil_jax.defaults import EMBEDDED_DELAYED_K, bundled_reader

        if self.checkpoint is not None:
            return self
        role = self.role(index_ks)
        folder = bundled_reader(role, self.k if self.k is not None else
                                self._cached_delayed_k(role, index_ks))
        if folder is not None:
            return dataclasses.replace(self, checkpoint=str(folder))
        if not self.embedded_fallback:
            raise UsageError(f"no bundled {role} reader in this install: give "
                             f"{self.checkpoint_flag}")
        log.warning("no bundled %s reader in this install: using the raw embedded MiniLM, "
                    "whose QA head is UNTRAINED; answers are arbitrary spans (pass %s)", role,
                    self.checkpoint_flag)
        k = EMBEDDED_DELAYED_K if role == "delayed" and self.k is None else self.k
        return dataclasses.replace(self, checkpoint="default", k=k)

    def role(self, index_ks: Collection[int] = ()) -> str:
        """Which bundled reader ("full" or "delayed") answers this request without a
        checkpoint: `bundled` when the command says, else `defaults.default_reader_role` of
        its k (without a k, the delayed one when an index holds only its cache)."""
        from dil_jax.defaults import bundled_delayed_ks, default_reader_role

        if self.bundled is not None:
            return self.bundled

        delayed_ks = bundled_delayed_ks() if self.k is None and index_ks else ()
        return default_reader_role(self.k, index_ks, delayed_ks)

    @staticmethod
    def _cached_delayed_k(role: str, index_ks: Collection[int]) -> int | None:
        """Without --k, the k of the first bundled delayed reader (the default one first) whose
        cache the index holds; None when it holds none."""
        from dil_jax.defaults import bundled_delayed_ks

        if role != "delayed":
            return None
        return next((k for k in bundled_delayed_ks() if k in index_ks), None)


def load_requested(request: ReaderRequest) -> Reader:
    """The reader of a request (its checkpoint named first: `ReaderRequest.resolved`), of
    either family (`load_reader`). Another k than a QANet / BiDAF's fixed split is a UsageError
    naming the request's flags."""
    request = request.resolved()
    try:
        reader = load_reader(request.checkpoint, request.k, request.max_question_len,
                             request.tokenizer, require_qa_head=request.require_qa_head,
                             overrides=ReaderOverrides(dtype=request.dtype))
    except FixedSplitError as error:
        asked = (f"{request.k_flag} {request.k} with {request.checkpoint_flag} "
                 f"{request.checkpoint}" if request.k_flag
                 else f"{request.checkpoint_flag} {request.checkpoint}, read at k = {request.k}")
        instead = request.fix or f"pass {request.k_flag} {error.split}"
        raise UsageError(f"{asked}: a {error.kind} reader's split is fixed (its passages' "
                         f"cached side is its {error.side}, k = {error.split}); {instead}"
                         ) from None
    from dil_jax.readers.matmul import resolve_matmul_dtype

    return reader.with_matmul_dtype(resolve_matmul_dtype(
        request.matmul_dtype, reader.capabilities.bfloat16_matmuls))
