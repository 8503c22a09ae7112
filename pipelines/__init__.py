"""Ready pipelines. Each module exposes ``build(size=None, **params)``."""
