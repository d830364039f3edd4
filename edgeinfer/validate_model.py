"""``python -m edgeinfer.validate_model MODEL``: kept as an entry point for other interpreters.

The validation itself lives in :mod:`edgeinfer.updates.validate`; agents of older releases and
provisioning scripts call this path.
"""

from __future__ import annotations

if __name__ == "__main__":
    from edgeinfer.updates.validate import main

    raise SystemExit(main())
