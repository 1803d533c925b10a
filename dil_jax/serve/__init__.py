"""`dil-jax serve`: the open-domain reader as an HTTP service (docs/serving.md).

    schemas    requests as JSON -> checked values (pure: every error names its field and value)
    answers    a question's candidates -> the ranked answers of `POST /v1/answer` (pure)
    pipeline   span scores of one context -> `POST /v1/read`'s answers, scored as Hugging Face's
               question-answering pipeline scores them (pure numpy)
    shapes     every program shape a read can meet, and the warm-up that compiles them
    worker     the one thread that owns the device: a bounded queue, batches gathered until
               one deadline, results routed back by request
    loading    the index and one `OpenDomainReader` per reader (the one place that loads)
    engine     the readers behind the worker: what each kind of job runs
    metrics    Prometheus text: requests, phase latencies, batch sizes, queue depth, compilations
    app        the Starlette app (routes, limits, the API key, the page)

Nothing here is imported by `dil-jax --help`: the command imports it in `run`.
"""
