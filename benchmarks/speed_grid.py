"""The question x passage speed grid (DeFormer/DilBert Table 1); same as `dil-jax bench`.

    python benchmarks/speed_grid.py                       # minilm + bert-base, a few minutes
    python benchmarks/speed_grid.py --suite minilm --ks 1,2,3,4,5
    python benchmarks/speed_grid.py --paper               # q = p = 100 (hours on 2 cores)

See benchmarks/README.md for what each column means and the recorded results.
"""

from __future__ import annotations

import argparse
import logging
import sys

from dil_jax.commands.bench import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
