"""The index folder and what it is built from: corpus, passages, windows, BM25, the build lock,
sentence embeddings and the byte-for-byte check (the map: `dil_jax.open_domain`)."""
