"""These are users' scripts that tests/tune/test_tune.py runs as subprocesses, not modules to import."""

collect_ignore_glob = ["*.py"]
