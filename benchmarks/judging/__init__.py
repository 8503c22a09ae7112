"""Pipelines used only to judge placement decisions: shaped like user scripts, never tuned against.

Each module exposes ``build(size=None, **params)`` like the bundled pipelines.
"""
