"""The device: profiles (what a device family is), host probing (what this machine has), detection."""
