"""Alembic migrations of the fleet database (``edgeinfer fleet db upgrade``; run on every start)."""
