"""The forms the device and the fleet manager share: what an event's evidence, a sample and a
line or zone look like on disk and on the wire (docs/architecture.md, base modules)."""
