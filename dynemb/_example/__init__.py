"""The builders of ``example.py`` (like ``dynemb.models`` and ``dynemb.datasets``, for
the example, ``examples/serve.py`` and the benchmarks that measure what the example
runs): its command line (``arguments``), data (``data``), DMP model (``model``),
training and evaluation loops and checkpoints (``loops``), and publication of
versions (``publishing``). Not part of dynemb's API: ``import dynemb`` does not load it.
"""

import logging
import warnings


def silence_known_notices() -> None:
    """Silences notices raised inside torch / TorchRec that user code cannot act on."""
    # Deprecation notices raised inside torch / TorchRec.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"(torch|torchrec)\.")
    # torch.fx logs, once per process, that is_fx_tracing() also answers True under
    # torch.export: TorchRec's modules call it on every forward, the example traces
    # nothing, and the line (one per rank) only asks TorchRec to use another function.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
