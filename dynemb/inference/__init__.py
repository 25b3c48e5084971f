"""Read-only dynamic tables for serving, exportable with ``torch.export``.

``exportable_tables`` holds the modules (``InferenceEmbeddingCollection``,
``InferenceEmbeddingBagCollection``); ``rows`` says where their rows come from (a
trained model or a checkpoint), ``arguments`` checks their arguments and ``lookup``
serves a batch.
"""
