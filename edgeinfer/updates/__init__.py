"""Model updates, transport-free: signed manifests, verified downloads, A/B slots, validation."""
