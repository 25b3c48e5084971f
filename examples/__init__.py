"""Scripts around example.py: ``serve.py`` serves what ``example.py --publish_every K``
published (``dynemb._example.publishing``: the publish directory's format)."""
