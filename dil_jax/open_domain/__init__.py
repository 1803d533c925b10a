"""Open-domain QA: retrieve passages for a question, read them with a delayed-interaction model.

The straight line, one module per step:

    corpus.py     documents in, passages (with source ids and character offsets) out
    index.py      the index folder: passages, BM25, tokenized windows (build, open)
    index_files.py  index.json: settings, file fingerprints and their check on open
    index_lock.py   the folder's build lock, and cleanup of what killed builds left
    cache.py      the passage cache: each window's passage side (lower states; ids at k = 0),
                  optionally the first upper block's passage arrays: format and reading
    cache_build.py  writing a cache: resumable, atomic
    cache_shards.py  a cache built in shards across processes and hosts (plan, waits)
    compression.py  the cache's storage schemes (float32, bfloat16, int8, pca<d>)
    reuse.py      the first upper block's passage q/k/v and attention statistics, as stored
    sentences.py  sentence embeddings of every passage (for prescreening)
    build.py      `build_open_domain_index`: corpus -> index -> one cache per reader
    retrieval.py  BM25 top-p passages of a question
    reader.py     `OpenDomainReader`: question lower -> cached passage side -> pair upper ->
                  best span per passage -> score fusion (`format_answer`)
    scoring.py    answer candidates, span score rules, best window per passage, score fusion
                  (`pick_answer`)
    evaluate.py   OpenSQuAD-style R and EM/F1 of readers
"""
