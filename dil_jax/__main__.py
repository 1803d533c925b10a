"""`python -m dil_jax` is the `dil-jax` command."""

import sys

from dil_jax.cli import main

sys.exit(main())
