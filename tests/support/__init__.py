"""What the tests share: the real assets and reference results, processes, brokers, fake roots.

Importable as ``support`` because ``pyproject.toml`` puts ``tests/`` on the path
(``[tool.pytest.ini_options] pythonpath``); fakes here only stand in for hardware this machine
lacks.
"""
