"""The fleet manager's HTTP API: one router per resource (``devices``, ``deployments``, ``artifacts``,
``access``, ``events``, ``overview``), the dependencies they share (``deps``: the services, authentication
and roles), the refusals they declare (``responses``), the dashboard (``web``), assembled by
``app.build_app``. The models are ``fleet/api/schemas.py``, the samples routes' ``sample_schemas.py``."""
