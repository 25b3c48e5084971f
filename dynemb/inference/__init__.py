"""Read-only dynamic tables for serving, exportable with ``torch.export``.

``exportable_tables`` holds the modules (``InferenceEmbeddingCollection``,
``InferenceEmbeddingBagCollection``); ``rows`` says where their rows come from (a
trained model or a checkpoint), ``arguments`` checks their arguments, ``lookup``
serves a batch and ``quantize`` holds the 8-bit rows' format (``weights_dtype``).
"""
