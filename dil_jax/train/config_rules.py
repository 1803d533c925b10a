"""The validation of training configs: one rule per key of `base_config()`, and the relations
between keys, checked before any model or data loads (`validate_config`, `config_problems`).
default_config.py holds the schema (every key with its default); this module what each value
must be. Config files import only default_config; the loader, the train command and the loop
import this."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_collections

from dil_jax.errors import UsageError
from dil_jax.options import OPTIONS, int_at_least, is_int, number_in
from dil_jax.train.train_config import TrainConfig

# One table of rules over the schema (default_config.base_config()), checked once when a config
# is loaded (before any model or data loads), so a bad value is reported by its key instead of
# surfacing as a ZeroDivisionError or a JAX shape error deep inside the loop. A rule returns None
# when the value is fine, else what the value must be.

Rule = Callable[[object], "str | None"]


def one_of(*choices: object) -> Rule:
    return lambda v: None if v in choices else f"one of {list(choices)}"


def text(*, callable_spec: bool = False) -> Rule:
    """A string; with callable_spec, "" or "module:function"."""
    def check(v: object) -> str | None:
        if not isinstance(v, str):
            return "a string"
        if callable_spec and v and (":" not in v or not all(v.partition(":")[::2])):
            return "\"\" or \"package.module:function\""
        return None

    return check


def boolean(v: object) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def names_from(*choices: str) -> Rule:
    """A comma-separated, non-empty list of distinct names from `choices`."""
    wanted = f"a comma-separated list of distinct names from {list(choices)}"

    def check(v: object) -> str | None:
        if not isinstance(v, str):
            return wanted
        names = [name.strip() for name in v.split(",")]
        ok = names and all(name in choices for name in names) and len(set(names)) == len(names)
        return None if ok else wanted

    return check


def lsh_layer_spec(v: object) -> str | None:
    """"" (off), "lower" or comma-separated 0-based layers, e.g. "0,1"."""
    wanted = '"" (off), "lower" or comma-separated 0-based layer indices such as "0,1"'
    if not isinstance(v, str):
        return wanted
    if v in ("", "lower"):
        return None
    return None if re.fullmatch(r"\s*\d+\s*(,\s*\d+\s*)*", v) else wanted


def optional_int_at_least(low: int) -> Rule:
    return lambda v: None if v is None or (is_int(v) and v >= low) else (
        f"an integer >= {low} (or None)")


POSITIVE = int_at_least(1)
FRACTION = number_in(0, 1)
WEIGHT = number_in(0)
RATE = number_in(0, low_open=True)

# Every checked key of base_config(); keys a config lacks are skipped (library callers may build
# a smaller config), keys not listed here are free-form.
RULES: dict[str, Rule] = {
    "seed": int_at_least(0),
    "data_seed": int_at_least(0),
    "batch_size": POSITIVE,
    "grad_accum_steps": POSITIVE,
    "num_epochs": RATE,
    "num_train_steps": int_at_least(1, off=-1),
    "model.checkpoint": text(),
    "model.num_lower_layers": OPTIONS["num_lower_layers"],
    "model.max_question_len": OPTIONS["max_question_len"],
    "model.dtype": one_of("float32", "bfloat16"),
    "model.passage_position_offset": int_at_least(0),
    "model.hidden_dropout": number_in(0, 1, high_open=True, optional=True),
    "model.attention_dropout": number_in(0, 1, high_open=True, optional=True),
    "model.lsh_attention_layers": lsh_layer_spec,
    "model.lsh_num_hashes": OPTIONS["lsh_num_hashes"],
    "model.lsh_bucket_size": OPTIONS["lsh_bucket_size"],
    "teacher.checkpoint": text(),
    "teacher.logits_file": text(),
    "loss.ce_weight": WEIGHT,
    "loss.kd_weight": WEIGHT,
    "loss.lrs_weight": WEIGHT,
    "loss.temperature": RATE,
    "loss.shared_norm": boolean,
    "optim.learning_rate": RATE,
    "optim.warmup_fraction": FRACTION,
    "optim.warmup_steps": int_at_least(0, off=-1),
    "optim.weight_decay": WEIGHT,
    "optim.max_grad_norm": number_in(0, optional=True),  # 0 / None: no clipping
    "optim.b1": number_in(0, 1, high_open=True),
    "optim.b2": number_in(0, 1, high_open=True),
    "optim.eps": RATE,
    "optim.frozen": text(),
    "optim.ema_decay": number_in(0, 1, high_open=True),
    "data.featurizer": text(callable_spec=True),
    "data.squad_file": text(),
    "data.validation_file": text(),
    "data.answer_candidates_file": text(),
    "data.null_window_fraction": number_in(0, 1, low_open=True),
    "data.length_buckets": text(),
    "data.train_articles": text(),
    "data.validation_articles": text(),
    "data.max_passage_len": OPTIONS["max_passage_len"],
    "data.doc_stride": OPTIONS["doc_stride"],
    "data.max_questions": int_at_least(1, off=-1),
    "data.max_validation_questions": int_at_least(1, off=-1),
    "data.distractors_per_question": int_at_least(0),
    "data.distractor_sources": names_from("paragraphs", "wikipedia"),
    "data.windows_per_question": int_at_least(0),
    "data.distill_file": text(),
    "data.max_distill_questions": int_at_least(1, off=-1),
    "data.cloze_per_paragraph": int_at_least(0),
    "data.cloze_sources": names_from("paragraphs", "wikipedia"),
    "data.synthetic.num_questions": POSITIVE,
    "data.synthetic.windows_per_question": POSITIVE,
    "data.synthetic.vocab_size": int_at_least(5),  # ids 0..3 are reserved
    "data.synthetic.null_fraction": FRACTION,
    "eval.evaluator": text(callable_spec=True),
    "eval.batch_size": POSITIVE,
    "eval.patience": int_at_least(1, off=-1),
    "eval.every_steps": int_at_least(0),
    "eval.threshold_questions": int_at_least(1, off=-1),
    "checkpoint.every_steps": POSITIVE,
    "checkpoint.keep": POSITIVE,
    "checkpoint.best_metric": text(),
    "checkpoint.best_mode": one_of("max", "min"),
    "checkpoint.evaluate_on_signal": boolean,
    "log.every_steps": POSITIVE,
    "distributed.num_cpu_devices": int_at_least(0),
    "distributed.num_processes": optional_int_at_least(1),
    "distributed.process_id": optional_int_at_least(0),
}


# Keys renamed since configs were first written: old key -> (new key, the name it took). A
# config file or override that still sets an old key is refused by name (it would otherwise be
# silently ignored); a workdir's config.json compares old keys as their new ones on resume.
RENAMED_KEYS = {"data.stride": ("data.doc_stride", "the name the featurizers and commands use"),
                "model.lsh_layers": ("model.lsh_attention_layers", "the EncoderConfig field it "
                                     "sets")}


def renamed_key_message(key: str) -> str | None:
    """How to fix a config that sets the renamed `key` ("data.stride"), or None."""
    if key not in RENAMED_KEYS:
        return None
    new, why = RENAMED_KEYS[key]
    return f"config.{key} was renamed config.{new} ({why}); set config.{new} instead"


def with_current_names(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat config ({"data.stride": 64}) with each renamed key under its new name: an old
    workdir's config.json compared with the config that resumes it."""
    return {RENAMED_KEYS[key][0] if key in RENAMED_KEYS else key: value
            for key, value in flat.items()}


def _lookup(config: ml_collections.ConfigDict, key: str) -> tuple[bool, object]:
    node: object = config
    for name in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            return False, None
        node = node[name]
    return True, node


def config_problems(config: ml_collections.ConfigDict) -> list[str]:
    """Every rule a value of `config` breaks, as "config.KEY = VALUE: must be ..." lines."""
    problems = [renamed_key_message(old) for old in RENAMED_KEYS if _lookup(config, old)[0]]
    for key, rule in RULES.items():
        present, value = _lookup(config, key)
        wanted = rule(value) if present else None
        if wanted:
            problems.append(f"config.{key} = {value!r}: must be {wanted}")
    if problems:
        return problems
    # Relations between keys, once each key is fine on its own.
    values = {key: _lookup(config, key) for key in (
        "batch_size", "grad_accum_steps", "loss.ce_weight", "loss.kd_weight", "loss.lrs_weight")}
    if all(present for present, _ in values.values()):
        batch, accum = values["batch_size"][1], values["grad_accum_steps"][1]
        if batch % accum:
            problems.append(f"config.batch_size = {batch} is not a multiple of "
                            f"config.grad_accum_steps = {accum}")
        if not sum(values[f"loss.{name}_weight"][1] for name in ("ce", "kd", "lrs")) > 0:
            problems.append("config.loss.ce_weight, kd_weight and lrs_weight are all 0: "
                            "nothing to train on; set one > 0")
    patience, metric = _lookup(config, "eval.patience"), _lookup(config, "checkpoint.best_metric")
    if patience[0] and metric[0] and patience[1] > 0 and not metric[1]:
        problems.append(f"config.eval.patience = {patience[1]} needs a metric to watch: set "
                        "config.checkpoint.best_metric (e.g. 'f1')")
    from dil_jax.train.reader_kinds import kind_problems  # model.kind: QANet / BiDAF rules
    from dil_jax.train.teacher_logits import logits_file_problems
    for check in (_shared_norm_problems, _distill_file_problems, _evaluation_interval_problems,
                  _article_overlap_problems, _window_problems, logits_file_problems,
                  kind_problems):
        problems += check(config)
    return problems


def _window_problems(config: ml_collections.ConfigDict) -> list[str]:
    """A text featurizer's windows must overlap: a stride of a window or more skips passage
    text, and the export would record windows no reader can read with."""
    from dil_jax.train.data import featurizes_text

    (_, length), (_, stride) = (_lookup(config, "data.max_passage_len"),
                                _lookup(config, "data.doc_stride"))
    if not featurizes_text(config.data.featurizer) or not isinstance(length, int) \
            or not isinstance(stride, int) or stride < length:
        return []
    return [f"config.data.doc_stride = {stride} must be smaller than config.data.max_passage_len"
            f" = {length} (a window holds max_passage_len - 1 passage tokens and moves by "
            "doc_stride)"]


def _evaluation_interval_problems(config: ml_collections.ConfigDict) -> list[str]:
    """eval.every_steps must be a multiple of checkpoint.every_steps: an evaluation's metrics are
    saved with a checkpoint of that step, which is what "best" and the export choose from."""
    (_, every), (_, checkpoint_every) = (_lookup(config, "eval.every_steps"),
                                         _lookup(config, "checkpoint.every_steps"))
    if not (isinstance(every, int) and isinstance(checkpoint_every, int)) or every <= 0 \
            or checkpoint_every <= 0 or every % checkpoint_every == 0:
        return []
    return [f"config.eval.every_steps = {every} is not a multiple of "
            f"config.checkpoint.every_steps = {checkpoint_every} (each evaluation is saved with "
            "its step's checkpoint)"]


def article_slice(spec: str) -> tuple[int | None, int | None] | None:
    """(start, stop) of an article slice "a:b" (either side may be empty), None if it is not
    one (the featurizer names a malformed slice when it reads the file)."""
    start, colon, stop = spec.partition(":")
    if not colon:
        return None
    try:
        return (int(start) if start.strip() else None, int(stop) if stop.strip() else None)
    except ValueError:
        return None


def slices_always_share(a: tuple[int | None, int | None],
                        b: tuple[int | None, int | None]) -> bool:
    """Whether two article slices share an article for every article count that leaves
    both non-empty ("0:28" and "20:35" always; "0:28" and "-7:" only in files of < 35).

    Past 2K articles (K the largest |bound|) every bound resolves to the same order among the
    others and 0 and n, so overlap no longer changes: the counts up to 2K + 1 are all cases.
    """
    largest = max((abs(v) for v in (*a, *b) if v is not None), default=0)
    both_non_empty = 0
    for count in range(1, 2 * largest + 2):
        articles = range(count)
        first, second = set(articles[slice(*a)]), set(articles[slice(*b)])
        if first and second:
            both_non_empty += 1
            if not first & second:
                return False
    return both_non_empty > 0


def _article_overlap_problems(config: ml_collections.ConfigDict) -> list[str]:
    """Validation articles taken from the training file must not be training articles: the
    validation loss, the best checkpoint and early stopping would then reward memorising."""
    present = [_lookup(config, f"data.{key}") for key in (
        "validation_file", "train_articles", "validation_articles")]
    if not all(found for found, _ in present) or present[0][1]:
        return []  # another validation file: its articles are other articles
    train_spec, validation_spec = str(present[1][1]), str(present[2][1])
    train, validation = article_slice(train_spec), article_slice(validation_spec)
    if train is None or validation is None or not slices_always_share(train, validation):
        return []
    relation = ("is the same slice as" if train == validation else "overlaps")
    return [f"config.data.validation_articles = {validation_spec!r} {relation} "
            f"config.data.train_articles = {train_spec!r}, and with config.data.validation_file "
            "= '' both come from config.data.squad_file: validation would score training "
            "articles; give disjoint slices (e.g. '0:28' and '28:35') or set "
            "config.data.validation_file"]


# ----------------------------------------------------------------------------- at load time
# Rules that read more than the config: files on disk (before any model loads) and the model's
# parameter names (once it is built, before the optimizer and the data).

# teacher.checkpoint values that name no folder on disk.
NAMED_CHECKPOINTS = ("", "student_init", "default", "minilm")


def _could_be_hub_id(name: str) -> bool:
    """"name" or "owner/name" whose owner is no local folder: the loader may still fetch it
    from the Hugging Face hub, so only the loader can say it is missing."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        return False
    owner, slash, _ = name.partition("/")
    return not slash or not Path(owner).is_dir()


def config_path_problems(config: TrainConfig) -> list[str]:
    """Files a valid config names that do not exist. Checked when a run starts, not in
    validate_config: `--print-config` of a distillation variant must work before its teacher
    is trained."""
    teacher = config.teacher.checkpoint
    weights = (config.loss.kd_weight, config.loss.lrs_weight)
    if teacher in NAMED_CHECKPOINTS or not any(weight > 0 for weight in weights):
        return []  # no teacher is loaded
    path = Path(teacher).expanduser()
    if path.exists() or _could_be_hub_id(teacher):
        return []
    return [f"config.teacher.checkpoint = {teacher!r}: no such folder ({path.absolute()}); "
            "train the teacher first (its workdir's params/), or give the folder of a "
            "fine-tuned full model"]


def check_config_paths(config: TrainConfig) -> None:
    """Raises UsageError naming each file the config names that does not exist."""
    problems = config_path_problems(config)
    if problems:
        raise UsageError("; ".join(problems))


def top_level_names(params: Any) -> list[str]:
    """The first level of a param tree, numbered siblings folded: ["block_0..block_11",
    "embeddings", "qa_outputs"] (a 24-layer model would list 24 blocks otherwise)."""
    numbered: dict[str, list[int]] = {}
    names = []
    for name in map(str, params if isinstance(params, dict) else ()):
        match = re.fullmatch(r"(.*_)(\d+)", name)
        if match:
            numbered.setdefault(match.group(1), []).append(int(match.group(2)))
        else:
            names.append(name)
    for stem, numbers in numbered.items():
        low, high = min(numbers), max(numbers)
        names.append(f"{stem}{low}" if low == high else f"{stem}{low}..{stem}{high}")
    return sorted(names)


def frozen_prefix_problems(frozen: str, params: Any) -> list[str]:
    """Each optim.frozen prefix that matches no parameter of `params` (a typo would silently
    train what was meant to stay fixed), with the params' top-level names to choose from."""
    import jax

    from dil_jax.train.optim import frozen_mask  # the optimizer's own matching rule

    choices = ", ".join(top_level_names(params))
    return [f"config.optim.frozen prefix {prefix!r} matches no parameter (top-level paths: "
            f"{choices}; a prefix is a path such as 'embeddings/word_embeddings')"
            for prefix in frozen.split(",") if prefix  # split as make_run_optimizer does
            and not any(jax.tree.leaves(frozen_mask(params, (prefix,))))]


def check_frozen_prefixes(frozen: str, params: Any) -> None:
    """Raises UsageError naming each config.optim.frozen prefix (`frozen`, comma-separated)
    that matches no param."""
    problems = frozen_prefix_problems(frozen or "", params)
    if problems:
        raise UsageError("; ".join(problems))


def _distill_file_problems(config: ml_collections.ConfigDict) -> list[str]:
    """data.distill_file and data.cloze_per_paragraph add windows without labels: only KD or
    LRS can learn from them, and shared normalisation has no group label for them."""
    present, path = _lookup(config, "data.distill_file")
    cloze_present, per_paragraph = _lookup(config, "data.cloze_per_paragraph")
    if present and path:
        source = f"config.data.distill_file = {path!r}"
    elif cloze_present and per_paragraph:
        source = f"config.data.cloze_per_paragraph = {per_paragraph}"
    else:
        return []
    weights = [_lookup(config, f"loss.{name}_weight") for name in ("kd", "lrs")]
    if not any(found and value > 0 for found, value in weights):
        return [f"{source} adds unlabelled questions, which only the teacher's losses train on: "
                "set config.loss.kd_weight or config.loss.lrs_weight > 0 (and "
                "config.teacher.checkpoint), or set it off"]
    if _lookup(config, "loss.shared_norm")[1]:
        return [f"{source} cannot be combined with config.loss.shared_norm = true (an "
                "unlabelled question has no group label)"]
    return []


def _shared_norm_problems(config: ml_collections.ConfigDict) -> list[str]:
    """loss.shared_norm needs data.windows_per_question = G > 0, and whole groups in every
    micro-batch: batch_size / grad_accum_steps (windows) a multiple of G. A G without
    shared_norm would be silently unused: refused too."""
    (on_present, on), (g_present, group) = (_lookup(config, "loss.shared_norm"),
                                            _lookup(config, "data.windows_per_question"))
    if not (on_present and g_present):
        return []
    candidates = _lookup(config, "data.answer_candidates_file")[1]
    if on and candidates:
        return [f"config.data.answer_candidates_file = {candidates!r} cannot be combined with "
                "config.loss.shared_norm = true (the grouped loss takes one label per window)"]
    if not on:
        return ([] if group == 0 else [
            f"config.data.windows_per_question = {group} is only used with "
            "config.loss.shared_norm = true: set that, or set it to 0"])
    if group == 0:
        return ["config.loss.shared_norm = true needs config.data.windows_per_question > 0 "
                "(G, the windows of each question's group)"]
    batch, accum = _lookup(config, "batch_size")[1], _lookup(config, "grad_accum_steps")[1] or 1
    if batch is None:
        return []
    if batch % group:
        return [f"config.batch_size = {batch} is not a multiple of "
                f"config.data.windows_per_question = {group} (with config.loss.shared_norm, "
                "batch_size counts windows and a step holds whole question groups)"]
    if batch % accum == 0 and (batch // accum) % group:
        return [f"config.batch_size / config.grad_accum_steps = {batch // accum} (the "
                "micro-batch) is not a multiple of config.data.windows_per_question = "
                f"{group}: each micro-batch must hold whole question groups"]
    return []


def validate_config(config: ml_collections.ConfigDict, source: str = "") -> TrainConfig:
    """The typed config of a training ConfigDict (`TrainConfig`: what the trainer reads), or
    UsageError listing every bad value (see RULES); `source` names the file in it."""
    problems = config_problems(config)
    if problems:
        where = f" ({source})" if source else ""
        raise UsageError(f"invalid training config{where}: " + "; ".join(problems)
                         + "; fix the config file or override with --config.KEY=VALUE")
    return TrainConfig.of(config)
