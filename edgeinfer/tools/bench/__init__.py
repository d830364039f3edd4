"""``edgeinfer bench``: every delegate side by side, one worker process per model and delegate."""
