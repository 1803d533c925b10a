"""The reader's Flax modules, their configs, and the pure-functional API (params in, arrays out).

    encoder_config.py  `EncoderConfig` (the BERT family's and XLNet's), `ReaderOverrides` (the
                    reader settings a load sets over a checkpoint's config), `lsh_layers_of`
    qanet_config.py, bidaf_config.py
                    `QANetConfig`, `BiDAFConfig`: the character readers' configs
    attention.py    self-attention (`SelfAttention`) and the softmax-part arithmetic that lets a
                    pair reuse its passage's attention statistics (`PassageAttentionStats`,
                    `passage_attention_stats`)
    layers.py       the layers a BERT-family reader stacks: activations, `Embeddings`, the
                    post-LayerNorm `Block` (and its row-subset form, `read_rows`)
    span_reader.py  what every reader module shares: segment ids, `ReaderOutput` and the span
                    head's scores, the aligned-pairs call; the module API listed there
    bert.py         the BERT-family reader module (`SpanReaderModule`: BERT, ALBERT, DistilBERT,
                    RoBERTa, XLM-RoBERTa, ELECTRA): the stack of blocks and the span head
    xlnet.py        XLNet's reader module (relative attention, single stream)
    delayed.py      `DelayedInteractionModel`: `encode_lower` (blocks 1..k on one segment),
                    `encode_upper` (blocks k+1..l over [question; passage] and the span head);
                    the length rule `check_segment_lengths`
    lsh.py, memory.py, reversible.py
                    the long-passage options (docs/long_passages.md, "Long passages"): Reformer
                    LSH attention, chunked row-wise maps and remat policies, reversible layers
    qanet.py, qanet_inputs.py, qanet_layers.py, bidaf.py
                    the QANet and BiDAF readers, with the delayed readers' split (docs/qanet.md)

Reading pairs at inference (the pair grid, the exact reuses, the scores) is `dil_jax.reading`'s,
which imports from here, never the reverse. Dependencies inside run one way: lsh <- attention;
attention, memory <- layers; span_reader <- bert, xlnet <- delayed.
"""
