"""Model updates, transport-free: signed manifests, verified downloads, A/B slots, validation, the health gate.

``signing`` · ``download`` · ``slots`` (the A/B state) · ``validate`` (the child-process check) ·
``updater`` (the steps up to the trial) · ``health`` (the gate a trial must pass).
"""
