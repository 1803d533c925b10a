"""Data loading and featurization (SQuAD)."""
