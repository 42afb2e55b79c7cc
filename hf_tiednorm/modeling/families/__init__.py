"""The model families built on the head and the loss: the family table (``table``), the configs (``configuration``,
``configuration_wrapped``), what every family shares (``common``, ``head_host``, ``tie_topology``, ``embeddings``,
``outputs``), the families (``seq2seq``, ``bart``, ``causal``) and the wrapper around any tied transformers model
(``wrapped``, ``wrapped_head``, ``wrapped_loss``)."""
