"""Scripts around example.py: ``serve.py`` serves what ``example.py --publish_every K``
published (``publishing.py``: the publish directory's format)."""
