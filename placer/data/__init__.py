"""The data layer: every persisted model, as plain pydantic data.

May import: pydantic, networkx, numpy, placer.errors, placer.files, placer.devices (its
light registry of device kinds and names). Never torch, dask, numba, the profiler, the
optimizer, the executor or the report: they all read and write these.

Each step of placer's flow reads the previous step's model and writes its own, so
every step can be saved, inspected and re-run from the saved result of the one
before:

=====================================  ===================================================
module                                 models
=====================================  ===================================================
:mod:`placer.data.measures`            ``Prediction``, ``Work``, ``Link``, ``TransferModel``
:mod:`placer.data.profile`             ``Profile`` (what was measured, per stage and device)
:mod:`placer.data.cost_table`          ``CostTable`` (what the optimizer knows at one size)
:mod:`placer.data.plan`                ``Plan``, ``StageChoice``, ``Schedule``
:mod:`placer.data.run`                 ``Run``, ``StageRecord``, ``TransferRecord``
:mod:`placer.data.report`              ``ReportFacts`` (what a report shows)
:mod:`placer.data.stream`              ``StreamProfile``, ``StreamPlan`` (a stream's measurements and plan)
=====================================  ===================================================

``h200.json`` beside these modules is a device description shipped as package data.
"""
