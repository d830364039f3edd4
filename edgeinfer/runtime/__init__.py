"""The runtime: model inspection, the Engine, delegates (one per vendor runtime) and their selection."""
