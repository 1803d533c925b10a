"""Hugging Face checkpoint import and orbax save/load of converted params.

A Hugging Face folder holds `config.json` and `model.safetensors` (read here with `safetensors`
and numpy, no torch needed) or `pytorch_model.bin` (read with torch when it is installed). Names
are mapped explicitly, every shape is checked against the Flax model's, and the report lists what
was loaded, what was initialised (a QA head absent from a plain `BertModel` checkpoint) and what
was ignored (pooler, pre-training heads).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dil_jax.atomic import staged_directory
from dil_jax.config import ConfigError, EncoderConfig
from dil_jax.errors import DilJaxError
from dil_jax.model import DelayedInteractionModel, Params
from dil_jax.modeling import num_param_blocks

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
ENCODER_CONFIG_FILE = "encoder_config.json"
PARAMS_DIR = "params"

# Prefixes of task models (BertForQuestionAnswering holds `bert.embeddings...`).
_BACKBONE_PREFIXES = ("bert.", "albert.", "distilbert.")
# Tensors of pre-training heads and poolers: not part of a reader, ignored by name.
_IGNORED = re.compile(
    r"^(pooler\.|cls\.|predictions\.|sop_classifier\.|vocab_|classifier\.|pre_classifier\.|"
    r"embeddings\.position_ids$)")


class CheckpointError(DilJaxError, ValueError):
    """A checkpoint cannot be read or does not fit the model; the message says which tensor."""


@dataclasses.dataclass
class ImportReport:
    """What a conversion did, by Hugging Face tensor name."""

    source: str
    loaded: list[str] = dataclasses.field(default_factory=list)
    initialized: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        lines = [f"imported {len(self.loaded)} tensors from {self.source}"]
        if self.initialized:
            lines.append(f"initialised (absent from the checkpoint): {', '.join(self.initialized)}")
        if self.ignored:
            lines.append(f"ignored (not part of a reader): {', '.join(self.ignored)}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- configs


def encoder_config_from_hf(hf: dict[str, Any], source: str = "config.json",
                           **overrides: Any) -> EncoderConfig:
    """Maps a Hugging Face `config.json` dict to an EncoderConfig (plus overrides such as k)."""
    model_type = hf.get("model_type")

    def need(key: str) -> Any:
        if key not in hf:
            raise CheckpointError(f"{source}: field {key!r} missing (model_type {model_type!r})")
        return hf[key]

    if model_type == "bert":
        values = dict(
            architecture="bert", hidden_size=need("hidden_size"),
            num_layers=need("num_hidden_layers"), num_heads=need("num_attention_heads"),
            intermediate_size=need("intermediate_size"), embedding_size=need("hidden_size"),
            type_vocab_size=hf.get("type_vocab_size", 2), hidden_act=hf.get("hidden_act", "gelu"),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
            attention_dropout=hf.get("attention_probs_dropout_prob", 0.1))
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError(f"{source}: position_embedding_type "
                                  f"{hf['position_embedding_type']!r} is not supported (absolute)")
    elif model_type == "albert":
        if hf.get("inner_group_num", 1) != 1:
            raise CheckpointError(f"{source}: inner_group_num {hf['inner_group_num']} is not "
                                  "supported (1, as in every released ALBERT)")
        values = dict(
            architecture="albert", hidden_size=need("hidden_size"),
            num_layers=need("num_hidden_layers"), num_heads=need("num_attention_heads"),
            intermediate_size=need("intermediate_size"),
            embedding_size=hf.get("embedding_size", 128),
            num_hidden_groups=hf.get("num_hidden_groups", 1),
            type_vocab_size=hf.get("type_vocab_size", 2),
            hidden_act=hf.get("hidden_act", "gelu_new"),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_dropout=hf.get("hidden_dropout_prob", 0.0),
            attention_dropout=hf.get("attention_probs_dropout_prob", 0.0))
    elif model_type == "distilbert":
        values = dict(
            architecture="distilbert", hidden_size=need("dim"), num_layers=need("n_layers"),
            num_heads=need("n_heads"), intermediate_size=need("hidden_dim"),
            embedding_size=need("dim"), type_vocab_size=0,
            hidden_act=hf.get("activation", "gelu"),
            layer_norm_eps=1e-12,  # hard-coded in Hugging Face's DistilBERT
            hidden_dropout=hf.get("dropout", 0.1),
            attention_dropout=hf.get("attention_dropout", 0.1))
    else:
        raise CheckpointError(f"{source}: unknown architecture model_type={model_type!r}; "
                              "supported: bert, albert, distilbert")
    values.update(vocab_size=need("vocab_size"),
                  max_position_embeddings=hf.get("max_position_embeddings", 512),
                  initializer_range=hf.get("initializer_range", 0.02),
                  pad_token_id=hf.get("pad_token_id", 0) or 0)
    values.update(overrides)
    try:
        return EncoderConfig(**values)
    except ConfigError as error:
        raise CheckpointError(f"{source}: {error}") from error


# ----------------------------------------------------------------------------- name map


def _dense_rules(hf: str, ours: tuple[str, ...]) -> dict[str, tuple[tuple[str, ...], Callable]]:
    """torch Linear [out, in] -> flax Dense kernel [in, out]."""
    return {f"{hf}.weight": (ours + ("kernel",), np.transpose),
            f"{hf}.bias": (ours + ("bias",), _identity)}


def _norm_rules(hf: str, ours: tuple[str, ...]) -> dict[str, tuple[tuple[str, ...], Callable]]:
    return {f"{hf}.weight": (ours + ("scale",), _identity),
            f"{hf}.bias": (ours + ("bias",), _identity)}


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _block_names(config: EncoderConfig, index: int) -> dict[str, str]:
    """Hugging Face module names of parameter block `index`, keyed by our submodule names."""
    if config.architecture == "bert":
        p = f"encoder.layer.{index}"
        return {"query": f"{p}.attention.self.query", "key": f"{p}.attention.self.key",
                "value": f"{p}.attention.self.value", "output": f"{p}.attention.output.dense",
                "attention_norm": f"{p}.attention.output.LayerNorm",
                "ffn_in": f"{p}.intermediate.dense", "ffn_out": f"{p}.output.dense",
                "output_norm": f"{p}.output.LayerNorm"}
    if config.architecture == "albert":
        p = f"encoder.albert_layer_groups.{index}.albert_layers.0"
        return {"query": f"{p}.attention.query", "key": f"{p}.attention.key",
                "value": f"{p}.attention.value", "output": f"{p}.attention.dense",
                "attention_norm": f"{p}.attention.LayerNorm", "ffn_in": f"{p}.ffn",
                "ffn_out": f"{p}.ffn_output", "output_norm": f"{p}.full_layer_layer_norm"}
    p = f"transformer.layer.{index}"
    return {"query": f"{p}.attention.q_lin", "key": f"{p}.attention.k_lin",
            "value": f"{p}.attention.v_lin", "output": f"{p}.attention.out_lin",
            "attention_norm": f"{p}.sa_layer_norm", "ffn_in": f"{p}.ffn.lin1",
            "ffn_out": f"{p}.ffn.lin2", "output_norm": f"{p}.output_layer_norm"}


def name_map(config: EncoderConfig) -> dict[str, tuple[tuple[str, ...], Callable]]:
    """Hugging Face tensor name (backbone prefix stripped) -> (our param path, transform)."""
    rules: dict[str, tuple[tuple[str, ...], Callable]] = {}
    emb = ("embeddings",)
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        if table == "token_type_embeddings" and not config.type_vocab_size:
            continue
        rules[f"embeddings.{table}.weight"] = (emb + (table, "embedding"), _identity)
    rules.update(_norm_rules("embeddings.LayerNorm", emb + ("norm",)))
    if config.architecture == "albert":
        rules.update(_dense_rules("encoder.embedding_hidden_mapping_in", emb + ("projection",)))
    for index in range(num_param_blocks(config)):
        block = (f"block_{index}",)
        for ours, hf in _block_names(config, index).items():
            if ours in ("attention_norm", "output_norm"):
                rules.update(_norm_rules(hf, block + (ours,)))
            elif ours in ("query", "key", "value", "output"):
                rules.update(_dense_rules(hf, block + ("attention", ours)))
            else:
                rules.update(_dense_rules(hf, block + (ours,)))
    rules.update(_dense_rules("qa_outputs", ("qa_outputs",)))
    return rules


def _strip_prefix(name: str) -> str:
    for prefix in _BACKBONE_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get_path(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def convert_state_dict(state: dict[str, np.ndarray], config: EncoderConfig,
                       rng: jax.Array | None = None,
                       source: str = "state dict") -> tuple[Params, ImportReport]:
    """Hugging Face tensors (numpy) -> Flax params, checking every name and shape.

    Raises CheckpointError naming a missing backbone tensor, an unexpected one, or the first
    tensor whose shape differs from what `config` implies. A missing QA head is initialised from
    `rng` (default key 0) and listed in the report.
    """
    rules = name_map(config)
    model = DelayedInteractionModel(config)
    rng = jax.random.key(0) if rng is None else rng
    fresh = model.init(rng)
    report = ImportReport(source=source)
    params: dict = {}
    unexpected = []
    for hf_name, tensor in state.items():
        name = _strip_prefix(hf_name)
        if name not in rules:
            if _IGNORED.match(name):
                report.ignored.append(hf_name)
            else:
                unexpected.append(hf_name)
            continue
        path, transform = rules[name]
        value = transform(np.asarray(tensor, dtype=np.float32))
        expected = _get_path(fresh, path).shape
        if tuple(value.shape) != tuple(expected):
            raise CheckpointError(
                f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, but the config "
                f"implies {tuple(expected) if transform is _identity else tuple(expected)[::-1]} "
                f"(for {'/'.join(path)}); does config.json describe this checkpoint?")
        _set_path(params, path, value)
        report.loaded.append(hf_name)
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensor(s) not in a {config.architecture} "
                              f"reader of {config.num_layers} layers: {sorted(unexpected)}")
    missing = [name for name, (path, _) in rules.items()
               if not _has_path(params, path)]
    missing_backbone = [name for name in missing if not name.startswith("qa_outputs.")]
    if missing_backbone:
        raise CheckpointError(f"{source}: missing tensor(s): {missing_backbone}")
    for name in missing:
        path, _ = rules[name]
        _set_path(params, path, np.asarray(_get_path(fresh, path)))
        report.initialized.append(name)
    return jax.tree.map(np.asarray, params), report


def _has_path(tree: dict, path: tuple[str, ...]) -> bool:
    try:
        _get_path(tree, path)
        return True
    except KeyError:
        return False


def export_state_dict(params: Params, config: EncoderConfig) -> dict[str, np.ndarray]:
    """Flax params -> Hugging Face tensor names (no backbone prefix) and layouts."""
    out = {}
    for name, (path, transform) in name_map(config).items():
        value = np.asarray(_get_path(params, path), dtype=np.float32)
        out[name] = np.ascontiguousarray(transform(value))  # transpose is its own inverse
    return out


# ----------------------------------------------------------------------------- files


_DAMAGED_FIX = ("it is damaged or incomplete (an interrupted download or copy?); re-download "
                "the checkpoint, or re-export it from the run that trained it")


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """One safetensors file -> {name: array}; a truncated or corrupt file is named, not traced."""
    from safetensors.numpy import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: missing (named by {SAFETENSORS_INDEX}); re-download the "
                              "checkpoint")
    try:
        return dict(load_file(path))
    except Exception as error:  # SafetensorError, OSError, a bad dtype in the header...
        raise CheckpointError(f"{path}: cannot read the weights ({type(error).__name__}: "
                              f"{error}); {_DAMAGED_FIX}") from error


def _read_json(path: Path, what: str) -> Any:
    """A JSON file's value; invalid JSON or an unreadable file is a CheckpointError naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not a readable {what} (not valid JSON: {error}); "
                              f"{_DAMAGED_FIX}") from error


def read_state_dict(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Tensors of a Hugging Face folder: safetensors (sharded too), else pytorch_model.bin.

    Raises CheckpointError naming the file when one is missing, truncated or corrupt.
    """
    folder = Path(folder)
    if (folder / SAFETENSORS_FILE).is_file():
        return _load_safetensors(folder / SAFETENSORS_FILE)
    if (folder / SAFETENSORS_INDEX).is_file():
        index_path = folder / SAFETENSORS_INDEX
        index = _read_json(index_path, "safetensors index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(shard, str) for shard in weight_map.values()):
            raise CheckpointError(f"{index_path}: no 'weight_map' object of tensor name -> shard "
                                  f"file; {_DAMAGED_FIX}")
        state: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(_load_safetensors(folder / shard))
        return state
    if (folder / TORCH_FILE).is_file():
        try:
            import torch
        except ImportError as error:
            raise CheckpointError(
                f"{folder / TORCH_FILE} needs torch to read; install it with "
                "`pip install 'dil_jax[torch]'` or convert the folder to safetensors") from error
        try:
            state = torch.load(folder / TORCH_FILE, map_location="cpu", weights_only=True)
            return {name: tensor.float().numpy() for name, tensor in state.items()}
        except Exception as error:  # truncated zip, pickle error, not a state dict...
            raise CheckpointError(f"{folder / TORCH_FILE}: cannot read the weights "
                                  f"({type(error).__name__}: {error}); {_DAMAGED_FIX}") from error
    raise CheckpointError(f"{folder}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {TORCH_FILE}")


def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """A local folder, the embedded default ("default"), or a hub id fetched when online."""
    name = str(name_or_path)
    if name in ("default", "minilm"):
        from dil_jax.defaults import default_checkpoint_dir
        return default_checkpoint_dir()
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"checkpoint {name!r} is a file; expected a folder with "
                              f"{CONFIG_FILE} and {SAFETENSORS_FILE}")
    is_hub_id = re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) is not None
    if not is_hub_id or name.startswith((".", "/", "~")):
        raise CheckpointError(f"checkpoint folder not found: {name!r}")
    try:
        from huggingface_hub import snapshot_download
        fetched = snapshot_download(
            name, allow_patterns=["config.json", "*.safetensors", "*.json", "*.txt", "*.model"])
    except Exception as error:  # offline, unknown id, ...: say both readings of the name
        raise CheckpointError(
            f"checkpoint {name!r}: no such local folder, and fetching it from the Hugging Face hub "
            f"failed ({type(error).__name__}: {error})") from error
    return Path(fetched)


def load_hf_checkpoint(name_or_path: str | os.PathLike, *, rng: jax.Array | None = None,
                       **config_overrides: Any) -> tuple[EncoderConfig, Params, ImportReport]:
    """Reads a Hugging Face checkpoint into (config, params, report).

    `config_overrides` set reader fields the checkpoint does not hold, e.g.
    `num_lower_layers=4, max_question_len=64, dtype="bfloat16"`.
    """
    folder = resolve_checkpoint(name_or_path)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE}")
    try:
        hf_config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{config_path}: not valid JSON ({error})") from error
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of model settings, got "
                              f"{type(hf_config).__name__}")
    # A reader exported by dil_jax records the split it was trained for; overrides still win.
    overrides = {**reader_defaults(folder), **config_overrides}
    config = encoder_config_from_hf(hf_config, str(config_path), **overrides)
    state = with_base_tensors(folder, read_state_dict(folder))
    params, report = convert_state_dict(state, config, rng, source=str(folder))
    for line in report.summary().splitlines()[1:]:
        log.warning(line)
    return config, params, report


MANIFEST_FILE = "dil_jax_manifest.json"


def read_manifest(folder: Path) -> dict[str, Any]:
    """The folder's `dil_jax_manifest.json` ({} if it has none), its known fields checked.

    Known fields: "reader" {num_lower_layers, max_question_len: int}, "training_config"
    (an object; its "model" may record num_lower_layers), "base_checkpoint" (str) and
    "from_base" (list of tensor names). Others are kept as they are (free-form records).
    Raises CheckpointError naming the file and the field.
    """
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return {}
    manifest = _read_json(path, "dil_jax manifest")
    fix = "re-export the reader, or delete the file to load the weights without it"

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; {fix}")

    if not isinstance(manifest, dict):
        raise bad(f"expected a JSON object, got {type(manifest).__name__}")
    reader = manifest.get("reader", {})
    if not isinstance(reader, dict):
        raise bad(f"'reader' must be an object, got {reader!r}")
    for key, value in reader.items():
        if key not in ("num_lower_layers", "max_question_len"):
            raise bad(f"unknown field 'reader.{key}' (known: num_lower_layers, "
                      "max_question_len)")
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(f"'reader.{key}' must be an integer, got {value!r}")
    training = manifest.get("training_config", {})
    if not isinstance(training, dict) or not isinstance(training.get("model", {}), dict):
        raise bad("'training_config' (and its 'model') must be objects")
    from_base = manifest.get("from_base") or []
    if not isinstance(from_base, list) or not all(isinstance(n, str) for n in from_base):
        raise bad(f"'from_base' must be a list of tensor names, got {from_base!r}")
    if from_base and not isinstance(manifest.get("base_checkpoint"), str):
        raise bad("'from_base' names tensors but 'base_checkpoint' (the checkpoint they come "
                  f"from) is {manifest.get('base_checkpoint')!r}")
    return manifest


def reader_defaults(folder: Path) -> dict[str, Any]:
    """Reader settings (k, max_question_len) recorded by `export_hf_checkpoint`, if any."""
    return dict(read_manifest(folder).get("reader", {}))


def trained_k(folder: Path) -> int | None:
    """The k a reader was trained with, as its manifest records it (None if it does not).

    The training config's model.num_lower_layers when recorded (how it was trained), else the
    split the export recorded.
    """
    manifest = read_manifest(folder)
    k = manifest.get("training_config", {}).get("model", {}).get("num_lower_layers")
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    return manifest.get("reader", {}).get("num_lower_layers")


def with_base_tensors(folder: Path, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fills in tensors a folder deliberately left out, from the base checkpoint its manifest
    names (`{"base_checkpoint": "default", "from_base": [tensor names]}`).

    A fine-tuned reader whose word embeddings were frozen ships without them: they are the base
    model's, bit for bit, and installing the base package already puts them on disk.
    """
    manifest_path = folder / MANIFEST_FILE
    manifest = read_manifest(folder)
    names = manifest.get("from_base") or []
    if not names:
        return state
    base_state = read_state_dict(resolve_checkpoint(manifest["base_checkpoint"]))
    base = {_strip_prefix(name): value for name, value in base_state.items()}
    merged = dict(state)
    for name in names:
        key = _strip_prefix(name)
        if key not in base:
            raise CheckpointError(f"{manifest_path}: tensor {name!r} is to come from base "
                                  f"{manifest['base_checkpoint']!r}, which has no {key!r}")
        merged[name] = base[key]
    return merged


# ----------------------------------------------------------------------------- orbax


def save_params(directory: str | os.PathLike, params: Params, config: EncoderConfig) -> Path:
    """Writes converted params (orbax) and the encoder config to `directory`, atomically.

    Everything is written to a sibling temporary folder first and renamed into place, so a reader
    never sees a half-written checkpoint.
    """
    import orbax.checkpoint as ocp

    directory = Path(directory).absolute()
    if directory.exists():
        raise CheckpointError(f"{directory} already exists; refusing to overwrite it")
    with staged_directory(directory, overwrite=False) as staging:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(staging / PARAMS_DIR, jax.tree.map(np.asarray, params))
        checkpointer.wait_until_finished()
        (staging / ENCODER_CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2))
    return directory


def load_params(directory: str | os.PathLike, **config_overrides: Any
                ) -> tuple[EncoderConfig, Params]:
    """Reads what `save_params` wrote; overrides (e.g. num_lower_layers) apply to the config."""
    import orbax.checkpoint as ocp

    directory = Path(directory).absolute()
    config_path = directory / ENCODER_CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: not a dil_jax checkpoint (no {ENCODER_CONFIG_FILE})")
    values = _read_json(config_path, "dil_jax encoder config")
    if not isinstance(values, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of EncoderConfig fields, "
                              f"got {type(values).__name__}")
    values = {**values, **config_overrides}
    try:
        config = EncoderConfig.from_dict(values)
    except ConfigError as error:
        raise CheckpointError(f"{config_path}: {error}") from error
    abstract = jax.eval_shape(DelayedInteractionModel(config).init, jax.random.key(0))
    if not (directory / PARAMS_DIR).is_dir():
        raise CheckpointError(f"{directory / PARAMS_DIR}: missing; {_DAMAGED_FIX}")
    try:
        params = ocp.StandardCheckpointer().restore(directory / PARAMS_DIR, abstract)
    except Exception as error:  # orbax/tensorstore: truncated array files, shape mismatch...
        raise CheckpointError(f"{directory / PARAMS_DIR}: cannot restore the params "
                              f"({type(error).__name__}: {str(error)[:500]}); {_DAMAGED_FIX}"
                              ) from error
    return config, params


def load_reader(checkpoint: str, k: int | None, max_question_len: int,
                tokenizer_path: str | None = None):
    """(model, params, tokenizer) from a dil_jax (orbax) folder or a Hugging Face checkpoint.

    k: the split point (None: the one a dil_jax checkpoint or export records, else 0). A k other
    than the one the reader was trained with is allowed (the same params serve every k) but
    logged as a WARNING: its answers are those of a model it was not trained as.
    The tokenizer is checked against the model's vocabulary (`check_tokenizer`).
    """
    from dil_jax.tokenization import TOKENIZER_FILES, TokenizationError, load_tokenizer

    overrides: dict[str, Any] = {"max_question_len": max_question_len}
    if k is not None:
        overrides["num_lower_layers"] = k
    folder = Path(checkpoint).expanduser()
    if (folder / ENCODER_CONFIG_FILE).is_file():
        config, params = load_params(folder, **overrides)
        # The k the training loop saved with (`save_params`), before --k overrode it.
        stored = _read_json(folder / ENCODER_CONFIG_FILE, "dil_jax encoder config")
        trained = stored.get("num_lower_layers")
        if isinstance(trained, bool) or not isinstance(trained, int):
            trained = None
        if tokenizer_path is None:
            if not any((folder / name).is_file() for name in TOKENIZER_FILES):
                raise TokenizationError(
                    f"{folder}: a dil_jax checkpoint without tokenizer files (none of "
                    f"{', '.join(TOKENIZER_FILES)}); pass --tokenizer (e.g. the folder it was "
                    "converted from)")
            tokenizer_path = str(folder)
    else:
        folder = resolve_checkpoint(checkpoint)  # once: a hub id is fetched here
        config, params, _ = load_hf_checkpoint(folder, **overrides)
        trained = trained_k(folder)
    if k is not None and trained is not None and k != trained:
        log.warning("--k %d differs from k=%d that the reader %s was trained with: the same "
                    "weights, but read with a split they were not trained for; expect worse "
                    "answers (pass --k %d, or leave --k out to use it)", k, trained, checkpoint,
                    trained)
    tokenizer = load_tokenizer(tokenizer_path or folder, vocab_size=config.vocab_size)
    return DelayedInteractionModel(config), params, tokenizer


def hf_config_from_encoder_config(config: EncoderConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` of a *ForQuestionAnswering model with these weights."""
    common = dict(vocab_size=config.vocab_size,
                  max_position_embeddings=config.max_position_embeddings,
                  initializer_range=config.initializer_range, pad_token_id=config.pad_token_id)
    if config.architecture == "distilbert":
        return dict(common, model_type="distilbert",
                    architectures=["DistilBertForQuestionAnswering"], dim=config.hidden_size,
                    n_layers=config.num_layers, n_heads=config.num_heads,
                    hidden_dim=config.intermediate_size, activation=config.hidden_act,
                    dropout=config.hidden_dropout, attention_dropout=config.attention_dropout)
    values = dict(common, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
                  num_attention_heads=config.num_heads,
                  intermediate_size=config.intermediate_size,
                  type_vocab_size=config.type_vocab_size, hidden_act=config.hidden_act,
                  layer_norm_eps=config.layer_norm_eps,
                  hidden_dropout_prob=config.hidden_dropout,
                  attention_probs_dropout_prob=config.attention_dropout)
    if config.architecture == "albert":
        return dict(values, model_type="albert", architectures=["AlbertForQuestionAnswering"],
                    embedding_size=config.embedding_size,
                    num_hidden_groups=config.num_hidden_groups, inner_group_num=1)
    return dict(values, model_type="bert", architectures=["BertForQuestionAnswering"])


def export_hf_checkpoint(directory: str | os.PathLike, params: Params, config: EncoderConfig,
                         tokenizer=None, dtype: str = "float32",
                         manifest: dict[str, Any] | None = None,
                         from_base: tuple[str, str] | None = None) -> Path:
    """Writes a Hugging Face folder (config.json, model.safetensors, tokenizer files and an
    optional dil_jax_manifest.json) that `load_hf_checkpoint` reads (and `transformers` too,
    unless tensors are left to a base).

    dtype "bfloat16" halves the size (params are cast back to float32 on load).
    from_base: (base checkpoint, name prefix): tensors under that prefix (e.g.
    "embeddings.word_embeddings") are left out and recorded in the manifest as coming from the
    base; the caller asserts they equal the base's (e.g. they were frozen in training).
    Written to a staging folder and renamed into place.
    """
    import ml_dtypes
    from safetensors.numpy import save_file

    if dtype not in ("float32", "bfloat16"):
        raise CheckpointError(f"export dtype must be float32 or bfloat16, got {dtype!r}")
    directory = Path(directory).absolute()
    prefix = f"{config.architecture}."
    tensors = {}
    left_to_base = []
    for name, value in export_state_dict(params, config).items():
        full_name = name if name.startswith("qa_outputs.") else prefix + name
        if from_base is not None and name.startswith(from_base[1]):
            left_to_base.append(full_name)
            continue
        tensors[full_name] = value.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else value
    manifest = dict(manifest or {}, reader={"num_lower_layers": config.num_lower_layers,
                                            "max_question_len": config.max_question_len})
    if from_base is not None:
        manifest.update(base_checkpoint=from_base[0], from_base=left_to_base)
    with staged_directory(directory) as staging:
        save_file(tensors, str(staging / SAFETENSORS_FILE), metadata={"format": "pt"})
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config_from_encoder_config(config),
                                                      indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(staging))
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    return directory
