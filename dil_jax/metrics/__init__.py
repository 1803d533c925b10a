"""Evaluation metrics (the official SQuAD EM/F1)."""
