"""The device: ``profiles`` (what a device family is), ``host`` (what a root filesystem says this machine
has), ``detect`` (which profile describes it) and ``sensors`` (its temperatures and power)."""
