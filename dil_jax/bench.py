"""Speed, FLOP and memory benchmark of a question x passage grid (the DeFormer/DilBert Table 1).

q questions and p passages, every (question, passage) pair read. Three phases are timed apart:

  NI Q   question lower blocks: `encode_lower` over the q questions (k blocks each), then the
         first upper block's q/k/v projections of each question (`project_upper`);
  NI P   passage lower blocks and projections, the same over the p passages;
  I Q-P  pair upper blocks: `encode_upper` (blocks k+1..l, the first without its projections,
         and the span head) over the q*p pairs, streamed through `GridReader` in fixed-size
         chunks.

The full model is k = 0: its NI Q is the question embeddings only, it has no NI P (a passage's
positions follow the question, so nothing is question-independent), and I Q-P runs all l blocks
on every pair. The Hugging Face PyTorch `BertForQuestionAnswering` peer reads the same grid as
`[CLS] q [SEP] p [SEP]` with the same weights, lengths, chunking and thread count.

Timing: one warm-up pass per variant (compiles, and touches every buffer) is excluded; every
measured pass ends with the device work synchronised (`jax.block_until_ready`, or the numpy copy
of the outputs); the variants are interleaved within each repeat, so that load from other
processes on a shared machine falls on all of them alike; each figure is the median of repeats.
Token ids are random: the cost of a dense transformer does not depend on which tokens it reads.

FLOPs and memory come from the compiled XLA programs (`Compiled.cost_analysis()` and
`.memory_analysis()`), next to the analytical count of `phase_flops`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.config import EncoderConfig
from dil_jax.grid import GridOutput, GridReader, hoists_projections, make_mesh
from dil_jax.model import DelayedInteractionModel, Params
from dil_jax.modeling import PASSAGE_SEGMENT, QUESTION_SEGMENT

PHASES = ("ni_q", "ni_p", "pairs")
PHASE_TITLES = {"ni_q": "NI Q", "ni_p": "NI P", "pairs": "I Q-P"}
FULL = "full (k=0)"
HF_PEER = "HF PyTorch"
CLS_ID, SEP_ID = 101, 102  # BERT uncased vocabulary; any ids < vocab_size would time the same
FIRST_WORD_ID = 1000  # random "words" are drawn from [FIRST_WORD_ID, vocab_size)


# ----------------------------------------------------------------------------- the grid


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """A grid of `num_questions` x `num_passages` pairs and its padded segment lengths.

    question_len counts `[CLS] q [SEP]`, passage_len counts `p [SEP]`; a pair is
    question_len + passage_len tokens, the same total the full model and the peer read.
    """

    num_questions: int
    num_passages: int
    question_len: int = 64
    passage_len: int = 256

    @property
    def num_pairs(self) -> int:
        return self.num_questions * self.num_passages

    @property
    def pair_len(self) -> int:
        return self.question_len + self.passage_len


@dataclasses.dataclass
class GridInputs:
    """Token ids and masks (numpy int32) of a grid's segments.

    q_ids, q_mask: [num_questions, question_len]; p_ids, p_mask: [num_passages, passage_len].
    """

    q_ids: np.ndarray
    q_mask: np.ndarray
    p_ids: np.ndarray
    p_mask: np.ndarray


def random_grid(spec: GridSpec, vocab_size: int, seed: int = 0) -> GridInputs:
    """Random words, no padding: `[CLS] w.. [SEP]` questions and `w.. [SEP]` passages.

    Every position is a real token, so `[CLS] q [SEP] p [SEP]` of the peer and our full model
    see exactly the same positions and token types (padding would sit between the segments).
    """
    rng = np.random.default_rng(seed)
    low = min(FIRST_WORD_ID, vocab_size // 2)

    def words(n: int, length: int) -> np.ndarray:
        return rng.integers(low, vocab_size, size=(n, length), dtype=np.int32)

    q_ids = words(spec.num_questions, spec.question_len)
    q_ids[:, 0], q_ids[:, -1] = CLS_ID, SEP_ID
    p_ids = words(spec.num_passages, spec.passage_len)
    p_ids[:, -1] = SEP_ID
    return GridInputs(q_ids, np.ones_like(q_ids), p_ids, np.ones_like(p_ids))


# ----------------------------------------------------------------------------- analytical FLOPs


def block_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of one transformer block on [batch, seq] tokens.

    With hidden size h, feed-forward size f and n = seq tokens:
      Q, K, V projections  3 * 2 n h^2
      attention scores     2 n^2 h      (all heads: n^2 dot products of length h/heads each)
      attention context    2 n^2 h
      output projection    2 n h^2
      feed-forward         2 * 2 n h f
    total = batch * (8 n h^2 + 4 n h f + 4 n^2 h). Softmax, LayerNorm, GELU, bias adds and the
    residuals are elementwise (O(n h + heads n^2) per block): XLA's count includes them, this
    formula does not; they are ~1-5% at BERT/MiniLM sizes.
    """
    n, h, f = seq, config.hidden_size, config.intermediate_size
    return batch * (8 * n * h * h + 4 * n * h * f + 4 * n * n * h)


def embedding_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """ALBERT's E -> H projection, 2 n E h; lookups cost no matmul (0 for BERT/DistilBERT)."""
    if config.architecture != "albert":  # ALBERT projects even when E == H (as transformers)
        return 0
    return batch * 2 * seq * config.embedding_size * config.hidden_size


def projection_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The Q, K, V projections of one block, 3 * 2 n h^2: the part of the first upper block
    that GridReader computes per segment instead of per pair (0 < k < l)."""
    return batch * 6 * seq * config.hidden_size ** 2


def qa_head_flops(config: EncoderConfig, batch: int, seq: int) -> int:
    """The span head, a Dense(h -> 2) on every token: 2 n h * 2."""
    return batch * 4 * seq * config.hidden_size


def phase_flops(config: EncoderConfig, phase: str, batch: int, question_len: int,
                passage_len: int) -> int:
    """Analytical matmul FLOPs of ONE call of a phase's program on `batch` inputs.

    ni_q:  embeddings + k blocks on [batch, question_len] questions (+ the first upper
           block's q/k/v projections when 0 < k < l);
    ni_p:  the same on [batch, passage_len] passages;
    pairs: (k = 0: the passage embeddings) + l - k blocks on [batch, question_len + passage_len]
           pairs (less the first one's projections when 0 < k < l) + the span head.
    """
    k, l_ = config.num_lower_layers, config.num_layers
    hoisted = hoists_projections(config)
    if phase in ("ni_q", "ni_p"):
        n = question_len if phase == "ni_q" else passage_len
        return (embedding_flops(config, batch, n) + k * block_flops(config, batch, n)
                + (projection_flops(config, batch, n) if hoisted else 0))
    if phase == "pairs":
        n = question_len + passage_len
        embed = embedding_flops(config, batch, passage_len) if k == 0 else 0
        upper = (l_ - k) * block_flops(config, batch, n)
        if hoisted:
            upper -= projection_flops(config, batch, n)
        return embed + upper + qa_head_flops(config, batch, n)
    raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")


# ----------------------------------------------------------------------------- compiled programs


@dataclasses.dataclass
class ProgramStats:
    """What XLA says of one compiled program (one call; bytes per device).

    flops: XLA's count, all ops (matmuls and elementwise), summed over the mesh's devices.
    peak_bytes: `peak_memory_in_bytes` as the backend reports it (0 where it reports none);
      argument + output + temp bytes is the footprint the buffer assignment allocates.
    """

    flops: float
    bytes_accessed: float
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    peak_bytes: int
    compile_s: float


def _cost_dict(compiled: Any) -> dict[str, float]:
    """`cost_analysis()` is a dict in current JAX, a list with one dict per program in older."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def _one_program_stats(lowered: Any, num_devices: int) -> ProgramStats:
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    cost = _cost_dict(compiled)
    memory = compiled.memory_analysis()
    peak = getattr(memory, "peak_memory_in_bytes", None)
    return ProgramStats(
        flops=float(cost.get("flops", float("nan"))) * num_devices,
        bytes_accessed=float(cost.get("bytes accessed", float("nan"))),
        argument_bytes=int(getattr(memory, "argument_size_in_bytes", 0)),
        output_bytes=int(getattr(memory, "output_size_in_bytes", 0)),
        temp_bytes=int(getattr(memory, "temp_size_in_bytes", 0)),
        peak_bytes=int(peak or 0), compile_s=compile_s)


def program_stats(lowered: Sequence[Any], num_devices: int = 1) -> ProgramStats:
    """Compiles the programs of one phase call (`jax.stages.Lowered`, run one after the other)
    and reads their cost and memory analyses: FLOPs, bytes and compile time add up; memory
    figures are the largest single program's (a projection's input, the lower states, counts
    as its arguments)."""
    stats = [_one_program_stats(one, num_devices) for one in lowered]
    return ProgramStats(
        flops=sum(s.flops for s in stats), bytes_accessed=sum(s.bytes_accessed for s in stats),
        argument_bytes=max(s.argument_bytes for s in stats),
        output_bytes=max(s.output_bytes for s in stats),
        temp_bytes=max(s.temp_bytes for s in stats), peak_bytes=max(s.peak_bytes for s in stats),
        compile_s=sum(s.compile_s for s in stats))


def _spec(shape: Sequence[int], dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


def lower_phase(reader: GridReader, params: Any, phase: str, num_questions: int,
                num_passages: int, question_len: int, passage_len: int) -> list[Any]:
    """The `jax.stages.Lowered` programs GridReader runs for one call of `phase`, from shapes.

    These are GridReader's own jitted programs (`GridReader.lowered`), lowered with the shapes
    of one call: a batch of `reader.batch_size` segments
    (encode_lower, then project_upper when 0 < k < l), or a chunk of `reader.chunk_size` pairs
    over replicated [num_questions, ...] / [num_passages, ...] states (and their q/k/v).
    """
    config = reader.model.config
    abstract = jax.tree.map(lambda x: _spec(np.shape(x), jnp.float32), params)
    batch, chunk = reader.batch_size, reader.chunk_size
    h, heads, dtype = config.hidden_size, config.num_heads, config.compute_dtype

    def qkv(n: int, length: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        return (_spec((n, heads, length, config.head_dim), dtype),) * 3

    if phase in ("ni_q", "ni_p"):
        length = question_len if phase == "ni_q" else passage_len
        segment = QUESTION_SEGMENT if phase == "ni_q" else PASSAGE_SEGMENT
        ids = _spec((batch, length), jnp.int32)
        programs = [reader.lowered("lower", abstract, ids, ids, segment)]
        if reader.hoists_projections:
            lower = _spec((batch, length, h), dtype)
            programs.append(reader.lowered("project", abstract, lower))
        return programs
    if phase != "pairs":
        raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")
    q_lower = _spec((num_questions, question_len, h), dtype)
    if config.num_lower_layers == 0:
        p_source = _spec((num_passages, passage_len), jnp.int32)
    else:
        p_source = _spec((num_passages, passage_len, h), dtype)
    q_mask = _spec((num_questions, question_len), jnp.int32)
    p_mask = _spec((num_passages, passage_len), jnp.int32)
    index = _spec((chunk,), jnp.int32)
    q_qkv = p_qkv = None
    if reader.hoists_projections:
        q_qkv, p_qkv = qkv(num_questions, question_len), qkv(num_passages, passage_len)
    return [reader.lowered("pairs", abstract, q_lower, q_mask, p_source, p_mask, index, index,
                           None, q_qkv, p_qkv)]


def phase_calls(reader: GridReader, phase: str, spec: GridSpec) -> int:
    """How many calls a phase makes on the grid (batches or chunks, the last padded; a batch
    of segments is one encode_lower call, plus one project_upper call when 0 < k < l)."""
    if phase == "ni_q":
        return -(-spec.num_questions // reader.batch_size)
    if phase == "ni_p":
        if reader.model.config.num_lower_layers == 0:
            return 0
        return -(-spec.num_passages // reader.batch_size)
    return -(-spec.num_pairs // reader.chunk_size)


def flop_profile(reader: GridReader, params: Any, spec: GridSpec) -> dict[str, dict[str, Any]]:
    """Per phase: XLA and analytical FLOPs of one call and of the whole grid, memory, compile.

    Memory and compile time are those of the program GridReader runs; XLA's FLOPs are counted on
    the batched-attention form of the same program (`attention_form="batched"`). Why: on CPU the
    reader loops attention over the batch (`lax.map`, a while loop), and XLA's cost analysis
    counts a while-loop body once, not once per trip, so the attention FLOPs of all but one
    example would vanish from the count. The batched form is the same operations on the same
    shapes (outputs equal to float32 rounding), so its count is the program's FLOPs. Padding of
    the last batch or chunk is counted: it is work the program does.
    """
    config = reader.model.config
    num_devices = reader.mesh.devices.size
    # Only lowered and compiled for its cost analysis, never run.
    accounting = GridReader(DelayedInteractionModel(config.replace(attention_form="batched")),
                            reader.mesh, reader.batch_size, reader.chunk_size)
    shapes = (spec.num_questions, spec.num_passages, spec.question_len, spec.passage_len)
    profile = {}
    for phase in PHASES:
        calls = phase_calls(reader, phase, spec)
        if calls == 0:
            continue
        stats = program_stats(lower_phase(reader, params, phase, *shapes), num_devices)
        flops = program_stats(lower_phase(accounting, params, phase, *shapes), num_devices).flops
        per_call = reader.chunk_size if phase == "pairs" else reader.batch_size
        analytical = phase_flops(config, phase, per_call, spec.question_len, spec.passage_len)
        profile[phase] = {
            "calls": calls, "inputs_per_call": per_call,
            "xla_flops_per_call": flops, "analytical_flops_per_call": analytical,
            "xla_over_analytical": flops / analytical if analytical else None,
            "xla_flops": flops * calls, "analytical_flops": analytical * calls,
            # XLA's own count of the program as run (attention loop body counted once).
            "xla_flops_per_call_as_run": stats.flops,
            "bytes_accessed_per_call": stats.bytes_accessed,
            "argument_bytes": stats.argument_bytes, "output_bytes": stats.output_bytes,
            "temp_bytes": stats.temp_bytes, "xla_peak_bytes": stats.peak_bytes,
            "compile_s": stats.compile_s,
        }
    return profile


def pair_memory_scaling(reader: GridReader, params: Any, grids: Sequence[tuple[int, int]],
                        question_len: int, passage_len: int) -> list[dict[str, Any]]:
    """Compiled memory of the pair program for growing (q, p) grids; nothing is executed.

    The program reads one fixed-size chunk of pairs, so its temporaries are independent of q*p;
    only its arguments (the replicated lower states, [q + p] segments) grow, linearly in q + p.
    """
    rows = []
    for num_questions, num_passages in grids:
        stats = program_stats(lower_phase(reader, params, "pairs", num_questions, num_passages,
                                          question_len, passage_len))
        rows.append({"num_questions": num_questions, "num_passages": num_passages,
                     "num_pairs": num_questions * num_passages,
                     "argument_bytes": stats.argument_bytes, "output_bytes": stats.output_bytes,
                     "temp_bytes": stats.temp_bytes, "xla_peak_bytes": stats.peak_bytes,
                     "footprint_bytes": (stats.argument_bytes + stats.output_bytes
                                         + stats.temp_bytes)})
    return rows


# ----------------------------------------------------------------------------- our reader


def _ready(x: Any) -> Any:
    return jax.block_until_ready(x)


def run_delayed_grid(reader: GridReader, params: Params, inputs: GridInputs,
                     max_pairs: int | None = None) -> tuple[dict[str, float], GridOutput | None]:
    """One timed pass over the grid: seconds per phase, and the grid's span scores.

    With `max_pairs` only that many pairs are read and no output is returned (the warm-up: it
    compiles the very programs the full pass runs, whose shapes do not depend on the pair count).
    """
    def segments(encode, ids: np.ndarray, mask: np.ndarray) -> tuple[Any, Any]:
        """Lower states (and, for 0 < k < l, their first-upper-block q/k/v), ready."""
        lower = encode(params, ids, mask)
        qkv = reader.project_segments(params, lower) if reader.hoists_projections else None
        return _ready((lower, qkv))

    times = {}
    start = time.perf_counter()
    q_lower, q_qkv = segments(reader.encode_questions, inputs.q_ids, inputs.q_mask)
    times["ni_q"] = time.perf_counter() - start
    start = time.perf_counter()
    if reader.model.config.num_lower_layers == 0:
        # The full model embeds passages inside the pair program.
        p_source, p_qkv = inputs.p_ids, None
    else:
        p_source, p_qkv = segments(reader.encode_passages, inputs.p_ids, inputs.p_mask)
    times["ni_p"] = time.perf_counter() - start
    start = time.perf_counter()
    if max_pairs is None:
        output = reader.read_grid(params, q_lower, inputs.q_mask, p_source, inputs.p_mask,
                                  q_qkv, p_qkv)
    else:
        output = None
        index = np.zeros(max_pairs, np.int32)
        for _, chunk in reader.iter_pair_chunks(params, q_lower, inputs.q_mask, p_source,
                                                inputs.p_mask, index, index, q_qkv=q_qkv,
                                                p_qkv=p_qkv):
            _ready(chunk)
    times["pairs"] = time.perf_counter() - start
    return times, output


# ----------------------------------------------------------------------------- the PyTorch peer


def hf_bert_config(config: EncoderConfig) -> Any:
    """The `transformers.BertConfig` of a BERT EncoderConfig (dropout is off in eval anyway)."""
    import transformers

    if config.architecture != "bert":
        raise ValueError(f"the PyTorch peer is BertForQuestionAnswering; architecture "
                         f"{config.architecture!r} is not bert")
    return transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size, hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size, layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id, hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout)


def hf_model_from_params(config: EncoderConfig, params: Params) -> Any:
    """A torch `BertForQuestionAnswering` (eval mode) holding exactly our params."""
    import torch
    import transformers

    from dil_jax.checkpoints import export_state_dict

    model = transformers.BertForQuestionAnswering(hf_bert_config(config)).eval()
    # torch.tensor copies: the exported arrays may be read-only views of device buffers.
    state = {name if name.startswith("qa_outputs.") else f"bert.{name}": torch.tensor(value)
             for name, value in export_state_dict(params, config).items()}
    # strict: every tensor of the torch model must come from our params, none left at its init.
    model.load_state_dict(state, strict=True)
    return model


def peer_device(backend: str, cuda_available: bool) -> tuple[str | None, str]:
    """Where the PyTorch peer runs: on the kind of device our reader runs on, or nowhere.

    backend: `jax.default_backend()`. Returns (torch device or None, why), so that a GPU run
    compares CUDA with CUDA and a TPU run (no torch peer there) says so instead of timing the
    host CPU against the accelerator.
    """
    if backend == "cpu":
        return "cpu", "JAX runs on the CPU"
    if backend in ("gpu", "cuda") and cuda_available:
        return "cuda", "JAX runs on a GPU and torch sees CUDA"
    if backend in ("gpu", "cuda"):
        return None, "JAX runs on a GPU but this torch has no CUDA: no peer on the same device"
    return None, f"no PyTorch peer for the {backend!r} backend (torch-xla is out of scope)"


def run_hf_grid(model: Any, inputs: GridInputs, chunk_size: int,
                max_pairs: int | None = None) -> tuple[dict[str, float], GridOutput | None]:
    """One timed pass of the peer: every pair as `[CLS] q [SEP] p [SEP]`, `chunk_size` at a time.

    Builds each chunk from per-segment tensors (as GridReader gathers inside its program) and
    returns the same span scores as `GridReader.read_grid`. All time is the pair phase. Runs on
    the model's device; copying each chunk's scores to the host synchronises it.
    """
    import torch

    device = next(model.parameters()).device
    nq, npas = inputs.q_ids.shape[0], inputs.p_ids.shape[0]
    q_len, p_len = inputs.q_ids.shape[1], inputs.p_ids.shape[1]

    def tensor(array: np.ndarray) -> Any:
        return torch.from_numpy(array).long().to(device)

    q_ids, p_ids = tensor(inputs.q_ids), tensor(inputs.p_ids)
    q_mask, p_mask = tensor(inputs.q_mask), tensor(inputs.p_mask)
    types = tensor(np.repeat(np.arange(2), (q_len, p_len)))
    q_index, p_index = (tensor(a.ravel()) for a in np.meshgrid(
        np.arange(nq), np.arange(npas), indexing="ij"))
    num_pairs = nq * npas if max_pairs is None else max_pairs
    start_logits = np.empty((num_pairs, q_len + p_len), np.float32)
    end_logits = np.empty((num_pairs, q_len + p_len), np.float32)
    start = time.perf_counter()
    with torch.inference_mode():
        for lo in range(0, num_pairs, chunk_size):
            qi, pi = q_index[lo:lo + chunk_size], p_index[lo:lo + chunk_size]
            out = model(input_ids=torch.cat([q_ids[qi], p_ids[pi]], dim=1),
                        attention_mask=torch.cat([q_mask[qi], p_mask[pi]], dim=1),
                        token_type_ids=types.expand(len(qi), -1))
            start_logits[lo:lo + len(qi)] = out.start_logits.float().cpu().numpy()
            end_logits[lo:lo + len(qi)] = out.end_logits.float().cpu().numpy()
    times = {"ni_q": 0.0, "ni_p": 0.0, "pairs": time.perf_counter() - start}
    if max_pairs is not None:
        return times, None
    return times, _hf_grid_output(start_logits, end_logits, inputs.p_mask, nq, npas, q_len)


def _hf_grid_output(start: np.ndarray, end: np.ndarray, p_mask: np.ndarray, nq: int, npas: int,
                    q_len: int) -> GridOutput:
    """[pairs, q_len + p_len] peer logits -> GridOutput (passage scores, `[CLS]` null scores)."""
    from dil_jax.modeling import PADDED_LOGIT

    pair_p_mask = np.repeat(p_mask[None], nq, axis=0).reshape(nq * npas, -1)

    def passage(logits: np.ndarray) -> np.ndarray:
        return np.where(pair_p_mask > 0, logits[:, q_len:], PADDED_LOGIT).reshape(nq, npas, -1)

    return GridOutput(passage(start), passage(end), start[:, 0].reshape(nq, npas),
                      end[:, 0].reshape(nq, npas))


def max_logit_difference(a: GridOutput, b: GridOutput) -> float:
    """Largest absolute difference of any span score (start, end, null) of two grids."""
    return max(float(np.max(np.abs(getattr(a, name) - getattr(b, name))))
               for name in ("start_logits", "end_logits", "null_start_logits",
                            "null_end_logits"))


# ----------------------------------------------------------------------------- a suite


@dataclasses.dataclass
class SuiteSpec:
    """One model on one grid: the variants to time and how.

    ks: the delayed-interaction splits to time besides the full model (k = 0).
    """

    name: str
    config: EncoderConfig
    params: Params
    grid: GridSpec
    ks: tuple[int, ...]
    weights: str  # where the params came from, for the record
    repeats: int = 3
    batch_size: int = 32
    chunk_size: int = 32
    with_hf: bool = True
    memory_grids: tuple[tuple[int, int], ...] = ((4, 4), (16, 16), (64, 64), (100, 100))
    seed: int = 0


SUITES = ("minilm", "bert-base", "tiny")
# (questions, passages, chunk size, lower batch) that finish in a few minutes on 2 cores.
SUITE_GRIDS = {"minilm": (16, 8, 8, 8), "bert-base": (8, 4, 8, 4), "tiny": (4, 3, 4, 4)}
TINY_LENGTHS = (16, 48)


def suite_model(name: str, question_len: int, seed: int = 0
                ) -> tuple[EncoderConfig, Params, str]:
    """(config, params, where the weights came from) of a named suite.

    minilm: the embedded all-MiniLM-L6-v2 (6 blocks, 384 wide; its QA head is freshly
      initialised, which does not change the cost); bert-base: BERT-base's shape (12 blocks,
      768 wide), randomly initialised; tiny: 3 blocks of MiniLM's width, for tests.
    """
    if name == "minilm":
        from dil_jax.checkpoints import load_hf_checkpoint

        config, params, _ = load_hf_checkpoint("default", max_question_len=question_len)
        return config, params, "all-MiniLM-L6-v2 (embedded), QA head random"
    if name == "bert-base":
        config = EncoderConfig(max_question_len=question_len)
        weights = "random init, BERT-base shape"
    elif name == "tiny":
        config = EncoderConfig(hidden_size=384, embedding_size=384, num_layers=3, num_heads=6,
                               intermediate_size=1536, vocab_size=1000,
                               max_position_embeddings=128, max_question_len=question_len)
        weights = "random init, tiny"
    else:
        raise ValueError(f"unknown suite {name!r}; suites: {SUITES}")
    params = DelayedInteractionModel(config).init(jax.random.key(seed))
    return config, jax.tree.map(np.asarray, params), weights


def default_ks(num_layers: int) -> tuple[int, ...]:
    """l - 2 and l - 1, the paper's interesting end (k = 10, 11 of 12)."""
    return tuple(k for k in (num_layers - 2, num_layers - 1) if k > 0)


def variant_name(k: int) -> str:
    return FULL if k == 0 else f"k={k}"


def thread_counts() -> dict[str, Any]:
    """Intra-op threads of both frameworks.

    XLA:CPU sizes its Eigen intra-op pool to the cores this process may run on (unless
    XLA_FLAGS says otherwise, recorded too); torch is set to the same number by `run_suite`.
    """
    counts: dict[str, Any] = {"xla_intra_op_threads": len(os.sched_getaffinity(0)),
                              "xla_flags": os.environ.get("XLA_FLAGS", ""),
                              "torch_intra_op_threads": None, "torch_inter_op_threads": None}
    try:
        import torch
    except ImportError:  # no peer without torch; the JAX side still runs
        return counts
    counts.update(torch_intra_op_threads=torch.get_num_threads(),
                  torch_inter_op_threads=torch.get_num_interop_threads())
    return counts


def _median_times(runs: list[dict[str, float]]) -> dict[str, float]:
    medians = {phase: statistics.median(run[phase] for run in runs) for phase in PHASES}
    medians["total"] = statistics.median(sum(run[p] for p in PHASES) for run in runs)
    return medians


def normalized_times(times: dict[str, float], config: EncoderConfig, k: int,
                     grid: GridSpec) -> dict[str, float | None]:
    """The paper's parenthesised figures: seconds per block per input of each phase.

    NI Q / (k q), NI P / (k p), I Q-P / ((l - k) q p); None where a phase runs no block.
    """
    upper = config.num_layers - k
    return {
        "ni_q": times["ni_q"] / (k * grid.num_questions) if k else None,
        "ni_p": times["ni_p"] / (k * grid.num_passages) if k else None,
        "pairs": times["pairs"] / (upper * grid.num_pairs) if upper else None,
    }


def projected_total(times: dict[str, float], grid: GridSpec, num_questions: int,
                    num_passages: int) -> float:
    """Seconds this variant would take on another grid, from its measured per-input costs.

    Each phase is linear in its inputs: NI Q in q, NI P in p, I Q-P in q p (fixed-size batches
    and chunks), so T(q', p') = NI_Q q'/q + NI_P p'/p + I_QP q'p'/(q p). A projection, not a
    measurement; it ignores the padding of the last batch or chunk.
    """
    return (times["ni_q"] * num_questions / grid.num_questions
            + times["ni_p"] * num_passages / grid.num_passages
            + times["pairs"] * num_questions * num_passages / grid.num_pairs)


Runner = Callable[[int | None], tuple[dict[str, float], GridOutput | None]]


def _readers(config: EncoderConfig, ks: Sequence[int], suite: SuiteSpec) -> dict[int, GridReader]:
    """One GridReader per split k, all on one mesh, same batch and chunk sizes.

    Sizes are capped by the grid: a lower batch larger than the number of questions or passages
    (or a chunk larger than the pairs) would time padding, not the model.
    """
    mesh = make_mesh()
    grid = suite.grid
    batch = min(suite.batch_size, grid.num_questions, grid.num_passages)
    chunk = min(suite.chunk_size, grid.num_pairs)
    return {k: GridReader(DelayedInteractionModel(config.replace(num_lower_layers=k)), mesh,
                          batch, chunk) for k in ks}


def _warm_up(runners: dict[str, Runner], num_pairs: int) -> dict[str, float]:
    """One chunk per variant (compiles every program the timed passes run); seconds each."""
    seconds = {}
    for name, runner in runners.items():
        start = time.perf_counter()
        runner(num_pairs)
        seconds[name] = time.perf_counter() - start
    return seconds


def _timed_repeats(runners: dict[str, Runner], repeats: int, log: Callable[[str], None]
                   ) -> tuple[dict[str, list[dict[str, float]]], dict[str, GridOutput]]:
    """Every variant once per repeat, interleaved so that load drift hits all of them alike.

    Returns the phase times of every pass and each variant's span scores from the first.
    """
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    outputs: dict[str, GridOutput] = {}
    for repeat in range(repeats):
        for name, runner in runners.items():
            times, output = runner(None)
            runs[name].append(times)
            if output is not None and name not in outputs:
                outputs[name] = output
            log(f"repeat {repeat + 1}/{repeats} {name}: {sum(times.values()):.3f} s "
                f"(load {load_average()[0]})")
    return runs, outputs


def run_suite(suite: SuiteSpec, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Times the full model, each k and the peer on one grid; returns the suite's record."""
    config, grid = suite.config.replace(max_question_len=suite.grid.question_len), suite.grid
    inputs = random_grid(grid, config.vocab_size, suite.seed)
    params = jax.device_put(suite.params)
    ks = (0,) + tuple(k for k in suite.ks if k != 0)
    readers = _readers(config, ks, suite)
    runners: dict[str, Runner] = {
        variant_name(k): (lambda max_pairs, r=readers[k]: run_delayed_grid(
            r, params, inputs, max_pairs)) for k in ks}
    record: dict[str, Any] = {"name": suite.name, "weights": suite.weights,
                              "config": config.to_dict(), "grid": dataclasses.asdict(grid),
                              "ks": list(ks), "batch_size": readers[0].batch_size,
                              "chunk_size": readers[0].chunk_size, "repeats": suite.repeats}
    if suite.with_hf:
        import torch

        device, why = peer_device(jax.default_backend(), torch.cuda.is_available())
        record["hf_device"], record["hf_device_reason"] = device, why
        if device is None:
            log(f"[{suite.name}] {why}")
        else:
            # On CPU the peer gets the threads XLA's intra-op pool has (see thread_counts).
            torch.set_num_threads(len(os.sched_getaffinity(0)))
            hf_model = hf_model_from_params(config, jax.tree.map(np.asarray, suite.params))
            hf_model = hf_model.to(device)
            record["hf_attention"] = hf_model.config._attn_implementation
            runners[HF_PEER] = lambda max_pairs: run_hf_grid(hf_model, inputs,
                                                             readers[0].chunk_size, max_pairs)
    record["threads"] = thread_counts()

    log(f"[{suite.name}] compiling and analysing the phase programs")
    record["programs"] = {variant_name(k): flop_profile(readers[k], params, grid) for k in ks}
    record["pair_memory_scaling"] = {
        variant_name(k): pair_memory_scaling(readers[k], params, suite.memory_grids,
                                             grid.question_len, grid.passage_len)
        for k in (0, max(ks))}
    log(f"[{suite.name}] warm-up: one chunk per variant")
    record["warmup_s"] = _warm_up(runners, min(readers[0].chunk_size, grid.num_pairs))
    cpu_before, start = cpu_snapshot(), time.perf_counter()
    runs, outputs = _timed_repeats(runners, suite.repeats,
                                   lambda line: log(f"[{suite.name}] {line}"))
    record["timed_s"] = time.perf_counter() - start
    record["others_cpu_cores"] = others_cpu_share(cpu_before, cpu_snapshot(), record["timed_s"])
    if HF_PEER in outputs:
        record["hf_max_logit_difference"] = max_logit_difference(outputs[FULL], outputs[HF_PEER])
    record["runs"] = runs
    record["results"] = summarize(runs, config, grid)
    for name, speedup in flop_speedups(record["programs"]).items():
        record["results"][name]["flop_speedup"] = speedup
    return record


def grid_flops(config: EncoderConfig, grid: GridSpec) -> int:
    """Analytical FLOPs of a whole grid at split `config.num_lower_layers`, without padding.

    q * NI Q(1 question) + p * NI P(1 passage) + q p * I Q-P(1 pair); the full model (k = 0)
    has no NI P (its passages are embedded inside the pair program).
    """
    q_len, p_len = grid.question_len, grid.passage_len
    total = grid.num_pairs * phase_flops(config, "pairs", 1, q_len, p_len)
    total += grid.num_questions * phase_flops(config, "ni_q", 1, q_len, p_len)
    if config.num_lower_layers:
        total += grid.num_passages * phase_flops(config, "ni_p", 1, q_len, p_len)
    return total


def flop_speedups(programs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """Analytical FLOPs of the full model's grid / each variant's: the speedup this grid allows.

    Counts every phase (and the padding of the last batch or chunk), so it is below
    l / (l - k) by exactly the cost of the lower blocks that the grid has to amortise.
    """
    totals = {name: sum(p["analytical_flops"] for p in phases.values())
              for name, phases in programs.items()}
    return {name: totals[FULL] / total for name, total in totals.items()}


def summarize(runs: dict[str, list[dict[str, float]]], config: EncoderConfig,
              grid: GridSpec, projection: tuple[int, int] = (100, 100)) -> dict[str, Any]:
    """Medians, normalised times and speedups of every variant over the full model.

    speedup: median total of the full model / median total of the variant;
    pair_speedup: the same for I Q-P alone (the q, p -> infinity limit);
    ideal: l / (l - k); projected_speedup: at `projection` = (q, p), from per-input costs;
    projected_flop_bound: the analytical FLOP ratio at `projection`, what perfect scaling gives.
    """
    medians = {name: _median_times(values) for name, values in runs.items()}
    full = medians[FULL]
    pq, pp = projection
    full_projected = projected_total(full, grid, pq, pp)
    projected_grid = dataclasses.replace(grid, num_questions=pq, num_passages=pp)
    full_flops = grid_flops(config.replace(num_lower_layers=0), projected_grid)
    results = {}
    for name, times in medians.items():
        k = 0 if name in (FULL, HF_PEER) else int(name.split("=")[1])
        upper = config.num_layers - k
        k_flops = grid_flops(config.replace(num_lower_layers=k), projected_grid)
        results[name] = {
            "k": k, "seconds": times,
            "min_total_s": min(sum(run[p] for p in PHASES) for run in runs[name]),
            "per_block_per_input": normalized_times(times, config, k, grid),
            "speedup": full["total"] / times["total"],
            "pair_speedup": full["pairs"] / times["pairs"],
            "ideal_speedup": config.num_layers / upper,
            "projected_speedup": full_projected / projected_total(times, grid, pq, pp),
            "projection_grid": [pq, pp],
            "projected_flop_bound": None if name == HF_PEER else full_flops / k_flops,
        }
    return results


# ----------------------------------------------------------------------------- the record


def machine_record() -> dict[str, Any]:
    """Device kind, versions and the CPU, for the JSON record."""
    device = jax.devices()[0]
    record = {"jax": jax.__version__, "jaxlib": getattr(jax.lib, "__version__", None) or
              _dist_version("jaxlib"), "flax": _dist_version("flax"),
              "torch": _dist_version("torch"), "transformers": _dist_version("transformers"),
              "platform": device.platform, "device_kind": device.device_kind,
              "num_devices": jax.device_count(), "cpu": _cpu_model(),
              "cpu_count": os.cpu_count(), "python": platform.python_version()}
    return record


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def retain_freed_memory() -> bool:
    """Makes glibc keep freed memory for reuse instead of handing it back to the OS.

    Why: XLA:CPU allocates each call's temporaries afresh (tens to hundreds of MB for a chunk of
    pairs); by default glibc maps such blocks with mmap, or in per-thread arenas, and returns
    them on free, so every call faults its pages in again and the kernel zeroes them: measured
    up to a third of a short program's wall time (one upper block at k = l - 1). One arena, no
    mmap and a high trim threshold make the second call reuse the first call's pages. The torch
    peer runs in the same process, so it gets the same allocator. Returns False where this is
    not glibc (nothing is changed then).
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2 ** 31 - 1)))


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (the machine may be shared with other work)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_snapshot() -> tuple[float, float] | None:
    """(CPU seconds all processes have been busy, CPU seconds of this process), or None.

    Busy time is /proc/stat's user + nice + system + irq + softirq + steal of every core.
    """
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return ((user + nice + system + irq + softirq + steal) / ticks, own.user + own.system)


def others_cpu_share(before: tuple[float, float] | None, after: tuple[float, float] | None,
                     wall_s: float) -> float | None:
    """Mean number of cores that OTHER processes kept busy between two snapshots.

    On a 2-core machine 0.0 means the benchmark had the machine to itself, 1.0 that other work
    took a whole core on average: the timings are then that much noisier and slower.
    """
    if before is None or after is None or wall_s <= 0:
        return None
    busy, own = after[0] - before[0], after[1] - before[1]
    return round(max(busy - own, 0.0) / wall_s, 2)


def ratio_checks(suite: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, measured in this run: delayed >= 0.9 l/(l-k), ours >= HF peer."""
    results, l_ = suite["results"], suite["config"]["num_layers"]
    checks = {}
    for name, row in results.items():
        if row["k"] in (l_ - 1, l_ - 2) and name not in (FULL, HF_PEER):
            target = 0.9 * row["ideal_speedup"]
            checks[f"{name} speedup >= 0.9 l/(l-k)"] = {
                "measured": row["speedup"], "target": target, "met": row["speedup"] >= target}
    if HF_PEER in results:
        ratio = results[HF_PEER]["seconds"]["total"] / results[FULL]["seconds"]["total"]
        checks["full model vs HF PyTorch (HF time / ours, medians)"] = {
            "measured": ratio, "target": 1.0, "met": ratio >= 1.0}
        # The fastest pass of each is the closest this run gets to an idle machine; on a shared
        # one the medians also measure how each runtime copes with losing a core.
        best = results[HF_PEER]["min_total_s"] / results[FULL]["min_total_s"]
        checks["full model vs HF PyTorch (HF time / ours, fastest passes)"] = {
            "measured": best, "target": 1.0, "met": best >= 1.0}
    return checks


def write_json(record: dict[str, Any], path: Path) -> Path:
    """Writes the record atomically (a rerun never leaves a half-written JSON)."""
    from dil_jax.atomic import write_atomic

    return write_atomic(path, json.dumps(record, indent=2, sort_keys=False) + "\n")
