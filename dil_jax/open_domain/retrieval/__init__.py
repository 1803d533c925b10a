"""BM25 retrieval behind one `Retriever` interface: rank-bm25, bm25s and Lucene (the map:
`dil_jax.open_domain`)."""
