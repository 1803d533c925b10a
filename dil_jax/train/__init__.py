"""Fine-tuning delayed-interaction readers: optax, DeFormer distillation, orbax checkpoints.

  config_files     ml_collections config files + `--config.key=value` overrides
  default_config   every config key, with defaults
  config_rules     the validation of a config: a rule per key, the relations between keys
  train_config     TrainConfig: a validated config as frozen typed sections (what the rest reads)
  data             the featurizer contract, resumable per-process batch order, synthetic data
  squad_data       the SQuAD featurizer and EM/F1 evaluator of the SQuAD configs
  losses           span cross-entropy, KD and LRS
  optim            AdamW + warmup/linear decay + clipping + weight-decay mask
  sharding         batch sharding over dil_jax.mesh.data_mesh, per-process batch assembly
  step             the jitted train step (accumulation scan, frozen teacher)
  checkpointing    orbax CheckpointManager: every N steps, last K + best, resume
  log_writers      JSONL, TensorBoard (tensorboardX), tqdm
  setup            config -> devices, windows and batch geometry, student/teacher, optimizer
  loop             train(config, ...): resume, the step loop, evaluation, checkpoints
  workdir          the run's folder: what train writes there, claiming it, config.json history
  divergence       non-finite steps: the flag folded per step, the check, TrainingDiverged
  export           the reader a finished run exports (params/, trained_from.json)
"""
