"""Open-domain QA: retrieve passages for a question, read them with a delayed-interaction model.

Three sub-packages hold what an index is made of, and the modules here use them:

    index/        the index folder and what it is built from
      corpus.py       documents in, passages (with source ids and character offsets) out
      scale_corpus.py a synthetic corpus of any size with realistic term statistics
      folder.py       the index folder: passages, BM25, tokenized windows (`build_index`,
                      `open_index`, `OpenDomainIndex`)
      store.py        the passage store: passages.jsonl + its line offsets, read by offset
      windows.py      windows.npz: written a block of passages at a time, mapped in place
      files.py        index.json: settings, file fingerprints and their check on open
      lock.py         the folder's build lock, and cleanup of what killed builds left
      sentences.py    sentence embeddings of every passage (for prescreening)
      verify.py       `dil-jax index --verify`: every byte against what the build recorded
    retrieval/    BM25 behind one `Retriever` interface
      bm25.py         what every engine shares: tokens, hits, the ranking rule, the manifest
      engines.py      rank-bm25 and bm25s, the engine choice, opening a saved index
      lucene.py       Lucene (pyserini), the DilBert paper's retriever
    cache/        passage caches: each window's passage side, computed once per reader and k
      store.py        `PassageCache`: the layout and reading rows (lower states; ids at k = 0;
                      optionally the first upper block's passage arrays)
      ragged.py       real tokens only: packing rows, padding them back (pure numpy)
      ragged_store.py one folder of a ragged cache: its arrays, read by row
      zarr_store.py   the arrays on tensorstore: zarr v3, sharded, chunk checksums
      location.py     where a cache is: a local folder, or a URL (gs://, s3://, file://)
      legacy.py       reading the padded .npy caches of earlier builds
      errors.py       the cache's errors
      manifest.py     a cache's manifest.json as values (`CacheKey`, `CacheManifest`)
      storage.py      the storage schemes of its float arrays (`Storage`: float32, bfloat16,
                      int8, pca<d>, pq<M>)
      row_arrays.py   arrays kept in several parts (a sharded cache's), read by global row
      digests.py      file digests recorded at build time, checked on open
      check.py        whether a cache serves a reader (`reader_cache_key`, `check_states`)
      build.py        writing a cache: resumable, atomic
      shards.py       a cache built in shards across processes and hosts (plan, waits)
      reuse.py        the first upper block's passage q/k/v and attention statistics, as stored
                      (the passage states themselves are the reader's: `Reader.passage_encoder`)
      missing.py      what an index holds instead of a missing cache, and the command to build it
      disk.py         disk space and write failures of a build, as one line

    build.py        `build_open_domain_index`: corpus -> index -> one cache per reader ->
                    sentence embeddings (the one builder `index` and `demo` call)
    build_peers.py  the processes of one sharded build agree on their settings
    reader.py       `OpenDomainReader`: retrieve -> question lower -> cached passage side ->
                    pair upper -> best span per passage -> score fusion (`format_answer`)
    answer_text.py  an answer as `dil-jax ask` shows it, read here or by a server (the
                    client imports it: the standard library only)
    chunk_size.py   pairs per chunk chosen on this machine (`--chunk-size auto`): a short
                    measurement of the reader's pair program, recorded per machine and reader
    scoring.py      answer candidates, span score rules, score fusion (`pick_answer`)
    abstention.py   "no answer found in the corpus": the threshold, its manifest record
    evaluate.py     OpenSQuAD-style R and EM/F1 of readers

Dependencies run one way: index/ uses cache/ and retrieval/, which use neither each other nor
index/; the modules here use all three; nothing in a sub-package imports a module of this level.
"""
