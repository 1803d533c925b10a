"""The bundled readers and transformers (issue 59, BAD 3 and 4).

A bundled reader leaves its word embeddings to the embedded MiniLM. Stored as a Hugging Face
`model.safetensors`, transformers loaded it with one "MISSING" line and random word embeddings and
answered wrongly; now its weights file has a name transformers does not look for, so it refuses
the folder, and `dil-jax export --format hf` writes the complete folder transformers reads, with
dil_jax's start/end logits (compared here with transformers itself, the independent reference).
And `dil-jax check`, the documented parity check, ended in a TypeError on the bundled readers'
bfloat16 weights: it now checks them.
"""

from __future__ import annotations

from tests.helpers import ASSETS, run_cli

# ------------------------------------------------------------ dil-jax check


def test_check_checks_a_bundled_reader_against_transformers(capsys):
    """It ended in `TypeError: Got unsupported ScalarType BFloat16`; a delayed reader's parity
    is of its full model (k = 0), the one transformers runs."""
    status, out, err = run_cli(["check", "--checkpoint", str(ASSETS / "minilm-squad-k4"),
                                "--k", "1", "--repeats", "1", "--max-passage-len", "48"], capsys)
    assert status == 0, out + err
    line = next(line for line in out.splitlines() if line.startswith("parity vs Hugging Face"))
    assert "read from its complete float32 export" in line and line.endswith("[OK]"), line
    assert "at random" not in line
