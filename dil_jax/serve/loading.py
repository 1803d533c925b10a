"""Loading what the server reads with: the index and one `OpenDomainReader` per reader.

`load_served_readers` is the one place the server loads anything, built as
`dil_jax/commands/odqa.py:_open_reader` builds a reader (index first, then the reader, then
its passage cache, a missing cache named with the command that builds it), so a change in how
readers are loaded touches this function only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dil_jax.errors import UsageError
from dil_jax.open_domain.cache.storage import Storage


@dataclasses.dataclass(frozen=True)
class ReaderSpec:
    """A reader to serve: its name in the API ("full", "delayed"), checkpoint and split.

    k_flag: the flag that gave k, named when a QANet / BiDAF refuses it (its split is fixed);
    None: k is the reader's role's (the full reader is read at k = 0)."""

    name: str
    checkpoint: str
    k: int | None  # None: the checkpoint's own
    k_flag: str | None = "--k"

    @property
    def checkpoint_flag(self) -> str:
        return f"--{self.name}-checkpoint"


@dataclasses.dataclass(frozen=True)
class ReadSettings:
    """How every reader reads (the server's flags)."""

    top_p: int = 29
    batch_size: int = 8
    # Pairs per chunk: N, "auto", "measure" or None (`open_domain.chunk_size.resolve_chunk_size`:
    # `dil-jax serve` gives "auto"; None reads the machine's record, else the platform's).
    chunk_size: int | str | None = None
    max_question_len: int = 32
    # How the index's caches were built (`--cache-dtype`); None: each cache's own.
    storage: Storage | None = None
    span_score: str = "logits"
    tokenizer: str | None = None
    # Question counts whose batches get their own passage-row padding (`ServedReader.shapes`);
    # batch_size is always one. (): batch_size alone, one padding for every batch.
    batch_shapes: tuple[int, ...] = ()
    # --prune-windows (`pruning.PruningSetting`: None every window, a WindowPruning, or
    # CALIBRATED), settled for the fusion weight `mu` requests with use_ir are answered with.
    pruning: Any = None
    mu: float = 0.5
    # --matmul-dtype (`readers.matmul.MATMUL_CHOICES`): what the readers' dense matmuls read.
    matmul_dtype: str = "float32"

    def shape_counts(self) -> tuple[int, ...]:
        """The question counts batches are padded to, smallest first, batch_size last."""
        return tuple(sorted({*(n for n in self.batch_shapes if n < self.batch_size),
                             self.batch_size}))


@dataclasses.dataclass
class ServedReader:
    """A loaded reader: the `OpenDomainReader` and what its answers are judged by.

    reader: padded for a whole batch (`batch_size` questions); shapes: question count ->
    a reader of the same model, weights and cache whose question batch is that count and
    whose passage side is padded to what that many questions can read. A lone question
    padded to a whole batch's rows copies ~8x the cached states it reads (the delayed
    reader's are [rows, 192, 384] floats), which cost it ~0.3 s on a 2-core CPU
    (docs/serving.md); with a smaller shape it does not, at the price of one more set of
    pair programs compiled by the warm-up.
    """

    name: str
    checkpoint: str
    reader: Any          # OpenDomainReader
    abstention: Any      # Abstention | None
    shapes: dict[int, Any] = dataclasses.field(default_factory=dict)
    # The window pruning of the requests it is exact for (`answers.reads_pruned`; None: none
    # pruned), why (`pruning.resolve_pruning`), and `shapes` with it: the same readers,
    # programs and caches (`OpenDomainReader.with_pruning` copies), reading fewer pairs.
    pruning: Any = None  # WindowPruning | None
    pruning_reason: str = ""
    pruned: dict[int, Any] = dataclasses.field(default_factory=dict)
    # Its pairs per chunk and why (`chunk_size.ChunkChoice`; None: not resolved, the grid's).
    chunk: Any = None
    # Why its matmuls read what they read (`readers.matmul.matmul_reason`; "": not said).
    matmul_reason: str = ""

    @property
    def k(self) -> int:
        return self.reader.reader.config.num_lower_layers

    @property
    def kind(self) -> str:
        """What the reader is: "encoder" (the BERT family) or "qanet" / "bidaf"."""
        return self.reader.reader.kind

    @property
    def matmul_dtype(self) -> str:
        """What its dense matmuls read (`Reader.matmul_dtype`)."""
        return self.reader.reader.matmul_dtype

    def for_questions(self, count: int, pruned: bool = False) -> Any:
        """The reader whose padding holds `count` questions: the smallest shape that does;
        pruned: its window-pruning copy (the unpruned one when this reader has none)."""
        shapes = self.pruned if pruned and self.pruned else self.shapes
        return next((shapes[n] for n in sorted(shapes) if n >= count), self.reader)

    def for_contexts(self, contexts: int, windows: int) -> Any:
        """The reader for `/v1/read` contexts read together: the smallest shape holding that
        many questions and their windows in its passage rows, else the whole batch's."""
        return next((self.shapes[n] for n in sorted(self.shapes)
                     if n >= contexts and self.shapes[n].passage_rows >= windows), self.reader)


def default_specs(full: str | None, delayed: str | None, k: int | None) -> list[ReaderSpec]:
    """The full reader (k = 0) and the delayed one (its own k unless given): the bundled
    ones when no checkpoint is given. Without a bundled reader the server refuses to start:
    an untrained QA head answers arbitrary spans, which a service must not serve silently."""
    from dil_jax.readers.request import ReaderRequest

    specs = []
    for name, given, split, k_flag in (("full", full, 0, None), ("delayed", delayed, k, "--k")):
        request = ReaderRequest(given, split, bundled=name, embedded_fallback=False,
                                checkpoint_flag=f"--{name}-checkpoint").resolved()
        specs.append(ReaderSpec(name, str(request.checkpoint), split, k_flag))
    return specs


def load_spec_reader(spec: ReaderSpec, settings: ReadSettings) -> Any:
    """The Reader of a spec, of either family (`readers.request.load_requested`, the loader
    `ask` and `index` use too): a QANet / BiDAF export asked for another k than its fixed
    split is a UsageError naming the spec's flags."""
    from dil_jax.readers.request import ReaderRequest, load_requested

    # A char reader's split is never 0 (its passages' side is encoded): not a full reader.
    fix = ("the full reader is read at k = 0: serve it as --delayed-checkpoint"
           if spec.k_flag is None else None)
    return load_requested(ReaderRequest(spec.checkpoint, spec.k, settings.max_question_len,
                                        settings.tokenizer, matmul_dtype=settings.matmul_dtype,
                                        checkpoint_flag=spec.checkpoint_flag,
                                        k_flag=spec.k_flag, fix=fix))


def load_served_readers(index_dir: str, specs: list[ReaderSpec], settings: ReadSettings,
                        say: Callable[[str], None] | None = None
                        ) -> Mapping[str, ServedReader]:
    """Opens the index once and each reader over it, with its passage cache, abstention
    thresholds and window pruning (settings.pruning: `add_pruning`). Each reader pads
    every batch's passage side to the most windows one batch can read
    (`shapes.passage_rows`), so its programs have one passage shape, and reads pairs
    settings.chunk_size at a time (`chunk_size.resolve_chunk_size`, measured on that
    passage shape; say: told a line before a measurement)."""
    from dil_jax.open_domain.abstention import abstention_of
    from dil_jax.open_domain.cache.missing import (
        THIS_READER,
        MissingCacheError,
        build_command,
        index_caches,
        missing_cache_message,
    )
    from dil_jax.open_domain.cache.store import CacheMismatchError
    from dil_jax.open_domain.chunk_size import resolve_chunk_size
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.pruning import Calibrated, calibration_of
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers.matmul import matmul_reason
    from dil_jax.serve.shapes import passage_rows

    # Thresholds first: a manifest's bad record is named before anything is loaded.
    abstentions = {spec.name: abstention_of(spec.checkpoint) for spec in specs}
    # Read for "calibrated" only: an explicit setting overrides the record, whatever it holds.
    calibrations = {spec.name: calibration_of(spec.checkpoint)
                    if isinstance(settings.pruning, Calibrated) else None for spec in specs}
    if not (Path(index_dir) / "index.json").is_file():
        raise UsageError(f"--index {index_dir}: no index there (build one with `dil-jax demo`, "
                         "which writes runs/demo-index, or `dil-jax index --out DIR ...`)")
    index = open_index(index_dir)
    served: dict[str, ServedReader] = {}
    for spec in specs:
        loaded = on_device(load_spec_reader(spec, settings))
        try:
            cache = index.open_cache(loaded, settings.storage)
        except CacheMismatchError as error:
            # No cache at all: name the plain one's folder and command, as `ask` does.
            storage = index.storage_to_build(loaded, settings.storage)  # what `index` builds
            key = index.cache_key(loaded, storage)
            folder = index.cache_dir(key)
            # A cache in the index's store (`dil-jax index --cache-store`) is there too.
            if folder.exists() or index.cache_location(key).exists("manifest.json"):
                raise
            k = loaded.config.num_lower_layers
            command = build_command(index_dir, index.settings.split,
                                    index.settings.max_passage_len, index.settings.doc_stride,
                                    spec.checkpoint, k, storage, settings.tokenizer)
            raise MissingCacheError(missing_cache_message(
                index_dir, folder.name, spec.checkpoint, k, storage,
                index_caches(index.directory), {key.model: THIS_READER}, command,
                folder.with_name(f".{folder.name}.partial").exists())) from error
        reader = OpenDomainReader(index, loaded, cache, top_p=settings.top_p,
                                  batch_size=settings.batch_size,
                                  span_score=settings.span_score)
        reader.passage_rows = passage_rows(index.windows.counts(settings.top_p),
                                           reader.grid.batch_size, settings.top_p)
        chunk = resolve_chunk_size(settings.chunk_size, reader, say=say)

        def smaller(count: int, loaded=loaded, cache=cache, size=chunk.size
                    ) -> OpenDomainReader:
            return OpenDomainReader(index, loaded, cache, top_p=settings.top_p,
                                    batch_size=count, chunk_size=size,
                                    span_score=settings.span_score)

        served[spec.name] = add_pruning(
            ServedReader(spec.name, spec.checkpoint, reader, abstentions[spec.name],
                         shaped_readers(reader, settings.shape_counts(), smaller),
                         chunk=chunk, matmul_reason=matmul_reason(settings.matmul_dtype,
                                                                  reader.reader)),
            settings, calibrations[spec.name])
    return served


def add_pruning(served: ServedReader, settings: ReadSettings, calibration: Any
                ) -> ServedReader:
    """`served` with its window pruning (`pruning.with_setting` of settings.pruning, settled
    for settings.mu; calibration: its manifest's record, for "calibrated") and a pruned
    copy of each batch shape, set after their `passage_rows` (a copy keeps the padding, so
    a pruned read runs the programs the warm-up compiled for the unpruned one). An explicit
    stop for a reader that cannot prune is a UsageError naming --prune-windows and the
    reader."""
    from dil_jax.open_domain.pruning import WindowPruningError, with_setting

    try:
        pruned, why = with_setting(served.reader, settings.pruning, calibration, settings.mu)
    except WindowPruningError as error:
        raise UsageError(f"--prune-windows {settings.pruning.label}: the {served.name} reader "
                         f"({served.checkpoint}): {error}") from None
    served.pruning, served.pruning_reason = pruned.pruning, why
    if pruned.pruning is not None:
        served.pruned = {count: shaped.with_pruning(pruned.pruning)
                         for count, shaped in served.shapes.items()}
    return served


def on_device(reader: Any) -> Any:
    """The reader with its weights copied to the devices once, replicated as every grid's
    programs take them (`MeshGrid.replicated`). A reader loads them as host numpy arrays, and
    a jitted call copies host arguments to the device at every call: for one `/v1/read` that
    was the whole MiniLM (~90 MB) for the pair program and its word embeddings (~47 MB) for
    the question's: most of the full reader's CPU time for one window (measured in
    docs/serving.md, "One context, one client"). The values are the same, so are the
    answers."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from dil_jax.mesh import data_mesh

    return reader.with_placed_params(jax.device_put(
        reader.params, NamedSharding(data_mesh(), PartitionSpec())))


def shaped_readers(reader: Any, counts: tuple[int, ...], smaller: Callable[[int], Any]
                   ) -> dict[int, Any]:
    """Question count -> a reader for batches of at most that many questions: `reader`
    itself for a whole batch, else `smaller(count)` (the same model and cache, a question
    batch of `count`) padding its passage side to the rows that many questions can read
    (`shapes.passage_rows`)."""
    from dil_jax.serve.shapes import passage_rows

    shaped = {}
    for count in counts:
        if count >= reader.grid.batch_size:
            shaped[count] = reader
            continue
        shaped[count] = smaller(count)
        shaped[count].passage_rows = passage_rows(reader.index.windows.counts(reader.top_p),
                                                  count, reader.top_p)
    return shaped
