"""One helper per mechanism, each used everywhere it applies (docs/architecture.md, base modules)."""
