import os
import sys
from pathlib import Path

# Tests import the working tree (this checkout), not whichever copy is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The tests compile the same tiny train step many times (every train() call builds a new jit);
# a persistent compilation cache shared by the test process and its subprocesses makes every
# compilation after the first a cache hit.
_CACHE = Path(os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/dil_jax_test_jax_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
