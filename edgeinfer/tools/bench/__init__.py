"""``edgeinfer bench``: every delegate side by side, one worker process per model and delegate.

``targets`` pairs models with delegates, ``runner`` drives the workers in interleaved rounds
through ``client`` (the parent's end of the JSON-lines protocol; ``worker`` is the process itself),
``report`` holds the figures, ``table`` and ``plot`` show them.
"""
