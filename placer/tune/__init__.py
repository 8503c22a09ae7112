"""``placer tune -- python train.py``: loader advice for a script left as it is.

May import: placer.tune.runs, placer.tune.search, placer.tune.stopping, placer.tune.words (lazily, by the CLI).

The script runs unchanged, several times, with :mod:`placer.tune.hook` loaded into its
Python: the hook sees the DataLoaders it builds, times how the script iterates them,
applies the setting of each run to the loader that holds the loop, and stops the script
after enough batches. :func:`placer.tune.search.tune` searches the drop-in's settings and
decides by the drop-in's rule (:func:`placer.stream.dropin.decide`); :mod:`placer.tune.caching` looks for
the drop-in's cache inside the Dataset in a run of the script and weighs it by runs with and without it;
:func:`placer.tune.runs.run_script` with ``mode="apply"`` runs the script to its end with a
saved recommendation; :func:`placer.tune.stopping.stopped` makes a search stopped by Ctrl-C a result
of its completed runs, marked interrupted.
"""
