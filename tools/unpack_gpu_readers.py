"""Turns the readers `tools/gpu_squad_v11.py` packed on a device back into params folders.

    python3 tools/unpack_gpu_readers.py --pieces DIR --name k4_warm --out runs/gpu/k4_warm/params

The pieces `NAME.tar.xz.NN` hold the params in bfloat16 without the frozen word embeddings; the
word embeddings come from the embedded base model here (`default`: all-MiniLM-L6-v2 in float32,
which the device's bfloat16 copy was rounded from), and the folder is written with `save_params`
(the format `model.checkpoint`, `dil-jax predict --checkpoint` and tools/bundle_readers.py read),
with trained_from.json beside it.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
from reader_pieces import flat_key, put_trained_from, read_pieces  # tools/, run as a script


def unpack(directory: Path, name: str, out: Path, base: str = "default") -> Path:
    import jax
    import ml_dtypes

    from dil_jax.checkpoints import save_params
    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.train.setup import load_or_init_reader

    members = read_pieces(directory, name)
    config = EncoderConfig.from_dict(json.loads(members["encoder_config.json"]))
    stored = np.load(io.BytesIO(members["params.npz"]))
    base_params = load_or_init_reader(base, None, {}, jax.random.key(0)).params
    base_leaves = {flat_key(path): leaf
                   for path, leaf in jax.tree_util.tree_flatten_with_path(base_params)[0]}
    abstract = jax.eval_shape(DelayedInteractionModel(config).init, jax.random.key(0))

    def restore(path, leaf) -> np.ndarray:
        key = flat_key(path)
        if key in stored:
            value = stored[key].view(ml_dtypes.bfloat16).astype(np.float32)
        else:  # the frozen word embeddings: the base model's own
            value = np.asarray(base_leaves[key], np.float32)
        if value.shape != leaf.shape:
            raise SystemExit(f"unpack_gpu_readers: {name}: {key} is {value.shape}, the config "
                             f"builds {leaf.shape}")
        return value

    params = jax.tree_util.tree_map_with_path(restore, abstract)
    save_params(out, params, config)
    return put_trained_from(members, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pieces", required=True, type=Path)
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--base", default="default", help="the base model whose word embeddings "
                        "the reader kept frozen (default: the embedded all-MiniLM-L6-v2; on a "
                        "device, its bfloat16 copy in .devcarry/minilm)")
    args = parser.parse_args(argv)
    print(unpack(args.pieces, args.name, args.out, args.base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
