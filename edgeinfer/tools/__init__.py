"""Tools built on the library: doctor, optimize, bench and the demo."""
