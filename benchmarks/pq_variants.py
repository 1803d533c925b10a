"""Which quantizer for `--cache-dtype pq<M>`: reconstruction error of a cache's real lower states.

    python benchmarks/pq_variants.py --cache runs/cache_compression_k4/caches/float32 \
        --codes 32 48 64 --out runs/pq_variants_k4

Reads the real (unmasked) token states of a float32 passage cache (`benchmarks/cache_compression.py`
builds one per reader: OUT/caches/float32), draws --train token states to fit on and --test
others to measure on (seeded, disjoint; `real_states`), and reports for each quantizer and code
size M (bytes per token) the relative squared error sum |x - x^|^2 / sum |x - mean|^2 over the
test states (the share of their variance lost) and the mean cosine of x and x^, with the seconds
the fit took:

  rotation variants of a product quantizer (faiss `ProductQuantizer(width, M, 8)` on the rotated
  states, one byte a sub-vector):
    pq-plain         no rotation
    pq-pca-sorted    the full-width PCA rotation, directions in the PCA's order
    pq-interleaved   that rotation, directions dealt to the sub-vectors in turn: what
                     `--cache-dtype pq<M>` stores (`Storage.round_trip` itself)
    pq-eigen-alloc   that rotation, directions allocated to balance the product of each
                     sub-vector's variances (Ge et al. 2013, "Optimized Product Quantization")
    pq-faiss-balanced  faiss `PCAMatrix` with `balanced_bins = M` (balances the sums)
    pq-opq           faiss `OPQMatrix(width, M)` (a learned rotation, 25 iterations)
  other quantizers at M bytes:
    rq               faiss `ResidualQuantizer(width, M, 8)`, beam 1 (fitted on at most 32,768
                     states: its training is the slowest)
    pca<M - 4>       `--cache-dtype pca<d>` of the same bytes (d int8 coordinates and a scale)

And for each M, encoding: the seconds `storage.pq_encode` (numpy, what a pq<M> build and the
check on open run) and faiss's `ProductQuantizer.compute_codes` take for the test states with the
same codebook (best of --repeats), and the share of codes on which they agree.

Writes OUT.json and OUT.md. faiss is needed (the [pq] extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

VARIANTS = ("pq-plain", "pq-pca-sorted", "pq-interleaved", "pq-eigen-alloc",
            "pq-faiss-balanced", "pq-opq", "rq", "pca")
RQ_FIT_TOKENS = 32768


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", required=True, help="a float32 passage cache folder")
    parser.add_argument("--codes", type=int, nargs="+", default=[32], help="M: bytes a token")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--train", type=int, default=65536, help="states fitted on")
    parser.add_argument("--test", type=int, default=20000, help="states measured on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="encoding timings: best of")
    parser.add_argument("--out", required=True, help="OUT.json and OUT.md are written")
    return parser.parse_args(argv)


def real_states(cache: Path, count: int, seed: int, block_rows: int = 256
                ) -> tuple[np.ndarray, int]:
    """([min(count, T), width] float32, T): `count` of the T real (unmasked) token states of a
    float32 passage cache (any layout `PassageCache` opens), drawn as the first `count` of a
    permutation of all T with `seed`, in that order; the cache is read `block_rows` windows at
    a time, so memory holds the drawn states, not the cache."""
    from dil_jax.open_domain.cache.store import PassageCache

    opened = PassageCache.open(cache, verify="none")
    if opened.storage.name != "float32" or opened.states is None:
        raise SystemExit(f"{cache}: a {opened.storage.name} cache of k = "
                         f"{opened.manifest.key.num_lower_layers}; give a float32 one, k >= 1")
    total = opened.num_tokens
    wanted = np.random.default_rng(seed).permutation(total)[:count]
    rank = np.argsort(wanted, kind="stable")
    positions = wanted[rank]  # ascending: the order the blocks are read in
    picked, seen = [], 0
    for start in range(0, len(opened), block_rows):
        rows = np.arange(start, min(start + block_rows, len(opened)))
        real = opened.read_states(rows)[np.asarray(opened.mask.take(rows)) != 0]
        inside = positions[(positions >= seen) & (positions < seen + len(real))]
        picked.append(real[inside - seen])
        seen += len(real)
    states = np.empty((len(wanted), opened.manifest.key.hidden_size), np.float32)
    states[rank] = np.concatenate(picked)
    return states, total


def eigen_allocation(variances: np.ndarray, parts: int) -> np.ndarray:
    """[width] an order of the directions (variances descending) in `parts` equal sub-vectors,
    each next direction to the sub-vector with room whose log-variance sum is smallest."""
    size = len(variances) // parts
    buckets: list[list[int]] = [[] for _ in range(parts)]
    sums = np.zeros(parts)
    for direction in np.argsort(-variances):
        open_parts = [part for part in range(parts) if len(buckets[part]) < size]
        part = min(open_parts, key=lambda p: sums[p])
        buckets[part].append(int(direction))
        sums[part] += np.log(max(float(variances[direction]), 1e-30))
    return np.concatenate(buckets)


def product_quantized(train: np.ndarray, test: np.ndarray, parts: int, seed: int) -> np.ndarray:
    """test's reconstruction by a faiss ProductQuantizer(width, parts, 8) fitted on train."""
    import faiss

    quantizer = faiss.ProductQuantizer(train.shape[1], parts, 8)
    quantizer.cp.seed = seed
    quantizer.cp.min_points_per_centroid = 1  # as `storage.train_pq_codebook`: no warning
    quantizer.train(np.ascontiguousarray(train, np.float32))
    return quantizer.decode(quantizer.compute_codes(np.ascontiguousarray(test, np.float32)))


def reconstruct(variant: str, train: np.ndarray, test: np.ndarray, parts: int,
                seed: int) -> np.ndarray:
    """[n_test, width]: test's states through `variant` at `parts` bytes, fitted on train."""
    import faiss

    from dil_jax.open_domain.cache.storage import Storage, fit_pca

    mean = train.mean(axis=0)
    width = train.shape[1]
    if variant == "pq-interleaved":
        storage = Storage(f"pq{parts}")
        return storage.round_trip(test, storage.fit(train))
    if variant == "pca":
        storage = Storage(f"pca{parts - 4}")
        return storage.round_trip(test, storage.fit(train))
    if variant == "pq-plain":
        return product_quantized(train, test, parts, seed)
    if variant in ("pq-pca-sorted", "pq-eigen-alloc"):
        basis = fit_pca(train, width).basis
        if variant == "pq-eigen-alloc":
            variances = np.square((train - mean) @ basis).mean(axis=0)
            basis = basis[:, eigen_allocation(variances, parts)]
        rotated = product_quantized((train - mean) @ basis, (test - mean) @ basis, parts, seed)
        return rotated @ basis.T + mean
    if variant in ("pq-faiss-balanced", "pq-opq"):
        if variant == "pq-opq":
            transform = faiss.OPQMatrix(width, parts)
            transform.niter = 25
        else:
            transform = faiss.PCAMatrix(width, width, 0, False)
            transform.balanced_bins = parts
        transform.train(np.ascontiguousarray(train - mean))
        rotated = product_quantized(transform.apply(np.ascontiguousarray(train - mean)),
                                    transform.apply(np.ascontiguousarray(test - mean)), parts,
                                    seed)
        return transform.reverse_transform(rotated) + mean
    if variant == "rq":
        quantizer = faiss.ResidualQuantizer(width, parts, 8)
        quantizer.max_beam_size = 1
        quantizer.train(np.ascontiguousarray(train[:RQ_FIT_TOKENS] - mean))
        codes = quantizer.compute_codes(np.ascontiguousarray(test - mean))
        return quantizer.decode(codes) + mean
    raise ValueError(variant)


def scores(test: np.ndarray, restored: np.ndarray, mean: np.ndarray) -> dict[str, float]:
    test64, restored64 = test.astype(np.float64), restored.astype(np.float64)
    lost = float(np.sum((test64 - restored64) ** 2) / np.sum((test64 - mean) ** 2))
    cosine = np.sum(test64 * restored64, axis=1) / (np.linalg.norm(test64, axis=1)
                                                    * np.linalg.norm(restored64, axis=1))
    return {"variance_lost": lost, "cosine": float(cosine.mean())}


def encoding(train: np.ndarray, test: np.ndarray, parts: int, repeats: int) -> dict[str, Any]:
    """Seconds (best of `repeats`) numpy's `pq_encode` and faiss's `compute_codes` take to
    encode test's rotated states with the pq<parts> codebook fitted on train, and their
    agreement (the share of equal codes)."""
    import faiss

    from dil_jax.open_domain.cache.storage import Storage, pq_encode

    basis = Storage(f"pq{parts}").fit(train)
    rotated = np.ascontiguousarray(basis.project(test))
    quantizer = faiss.ProductQuantizer(test.shape[1], parts, 8)
    faiss.copy_array_to_vector(basis.codebook.ravel(), quantizer.centroids)
    seconds = {}
    for name, encode in (("numpy", lambda: pq_encode(rotated, basis.codebook)),
                         ("faiss", lambda: quantizer.compute_codes(rotated))):
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            codes = encode()
            best = min(best, time.perf_counter() - start)
        seconds[name] = (best, codes)
    return dict(codes=parts, tokens=len(test), numpy_s=seconds["numpy"][0],
                faiss_s=seconds["faiss"][0],
                agreement=float(np.mean(seconds["numpy"][1] == seconds["faiss"][1])))


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| M (bytes) | quantizer | variance lost | mean cosine | fit + encode s |",
             "|---|---|---|---|---|"]
    lines += [f"| {row['codes']} | {row['variant']} | {row['variance_lost']:.4f} | "
              f"{row['cosine']:.4f} | {row['seconds']:.0f} |" for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    from dil_jax.atomic import write_atomic
    from dil_jax.bench.machine import machine_record

    drawn, total = real_states(Path(args.cache), args.train + args.test, args.seed)
    train, test = drawn[:args.train], drawn[args.train:]
    mean = train.mean(axis=0).astype(np.float64)
    rows = []
    for parts in args.codes:
        for variant in args.variants:
            start = time.perf_counter()
            restored = reconstruct(variant, train, test, parts, args.seed)
            rows.append(dict(codes=parts, variant=variant, seconds=time.perf_counter() - start,
                             **scores(test, restored, mean)))
            print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    speeds = [encoding(train, test, parts, args.repeats) for parts in args.codes]
    table = markdown(rows) + "\n\n" + "\n".join(
        [f"| M | encode {len(test):,} states: numpy s | faiss compute_codes s | codes equal |",
         "|---|---|---|---|"] + [f"| {row['codes']} | {row['numpy_s']:.2f} | "
                                 f"{row['faiss_s']:.2f} | {row['agreement']:.6f} |"
                                 for row in speeds])
    print(table)
    record = dict(command=" ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                  cache=args.cache, states=total, train=len(train), test=len(test),
                  machine=machine_record(), rows=rows, encoding=speeds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out.with_suffix(".json"), json.dumps(record, indent=2))
    write_atomic(out.with_suffix(".md"), table + "\n")
    return rows


if __name__ == "__main__":
    main()
