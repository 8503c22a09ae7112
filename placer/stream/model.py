"""Predicting a stream's throughput from its profile: operational analysis, as in Plumber.

May import: placer.data.stream, placer.stream.{chain,rates}. Pure arithmetic on a
:class:`~placer.data.stream.StreamProfile`: no device, no measuring. The chain and its costs are
:mod:`placer.stream.chain`; each node's rate and what caps it, :mod:`placer.stream.rates`.

A stream runs as a chain of nodes (source, copies where data changes location,
per-batch stages, step), every node working on a different batch at once. In steady
state each batch needs some seconds of each *resource*, and the stream goes no faster
than its busiest resource allows:

- **a CPU stage** with ``w`` thread workers: ``speedup(w) / t`` batches per second,
  ``t`` its seconds per batch on one worker and ``speedup`` its measured scaling
  (interpolated between measured worker counts, held at the last one beyond them);
  the source and a step on the CPU run in one thread: ``1 / t``; a DataLoader
  source with ``w`` worker processes: ``s(w) / t``, ``s`` their speed-up measured by
  reading the source through the cores' count of workers at once (interpolated from one,
  held beyond), else ``min(w, cores)``; each batch's CPU then ``t * min(w, cores) / s``;
- **an accelerator**: the stages on it share its time: ``1 / sum(t)`` over them;
- **a link**: the copies into and out of one accelerator share it: ``1 / sum(copy s)``
  (both directions on one link: a simple, cautious model);
- **the cores**: every node that runs on the host (CPU stages, the source, copies into
  a simulated device and stages on it, which run on the host too) uses the host CPU
  seconds it was measured to use per batch; the cores supply ``os.cpu_count()``
  seconds per second: ``cores / sum(cpu s)``. The threads that wait (the main thread,
  a step driving a real GPU) are not charged;
- **the GIL**: every thread of the process holds it for a share ``g`` of its time: a
  batch stage's share is estimated from two thread workers' speed-up ``s2`` by Amdahl's
  law (``g = 2 / s2 - 1``); the step's and the source's were measured with a probe
  thread (an iterable source not measured counts as holding it throughout: it is
  Python code; a DataLoader source with worker processes does not hold it); process
  workers hold it in this process only to move batches (their one-process round trip
  beyond the stage's in-process seconds). All of them share one GIL:
  ``1 / sum(g * t)``;
- **remote workers** (``worker_kind="dask"``, with the profile's ``cluster``): the
  stage's rate as tasks on the cluster (:mod:`placer.stream.remote`: tasks in flight,
  the cluster's cores, the network); here it takes the client's CPU per batch (and
  holds the GIL for it), and on a cluster that runs on this machine the workers'
  compute joins the cores;
- **torch intra-op threads**: with ``StreamSettings.torch_threads`` set, a step on the
  CPU takes the seconds measured at that count (where measured);
- **the cores the step shares**: a step on the CPU was also timed beside a thread
  keeping one core busy (``busy_seconds``; a parallel region waits for its slowest
  thread, so on every core it can slow by 2× where one thread slows by 10 %). While
  the other host nodes keep ``u`` cores busy (their CPU seconds per batch times the
  rate; at most 1), the step takes ``alone + u · (beside − alone)``; the rate and
  ``u`` are solved together (a damped fixed point);
- **the cores beside the step's threads**: a step on the CPU at ``n > 1`` intra-op threads
  keeps ``n - 1`` cores busy between its batches too (torch's OpenMP threads spin-wait after
  each parallel region, for milliseconds), so the nodes beside it (in worker processes, or in
  threads of their own; not one batch at a time) share what is left:
  ``max(1, cores - (n - 1)) / sum(their cpu s)``. Measured in a plain script on 2 cores: a
  tokenizer on 2 DataLoader worker processes fed a step at 2 torch threads at 5,400-7,800
  samples/s, the rate of 1 worker (6,200), and at 1 torch thread 9,400-11,600; one loader thread
  (audio, its decode cached) at 657 against 1,374.

Throughput is the smallest rate; the resource that sets it is the bottleneck. With
``workers=0`` nothing overlaps: one batch takes the sum of every node's seconds, each as
the profile's sweep (which ran one batch at a time) measured it in turn, slow batches
included (``StreamStageProfile.in_turn_seconds``), where the chain is the sweep's: every member
on one device, the step at the threads it was swept at, no cache.
A Dataset or DataLoader source read by worker processes costs, per batch, what it took
through one worker process as the profile measured it (``StreamStageProfile.worker_seconds``:
collating into shared memory and sending the batch included; a tokenizer took 4.6 ms a
batch in the main process and 7 ms through a worker), wall and CPU.
A stream with queues is never predicted slower than its members taking turns
(:func:`alternating`): where overlapping them costs more than it saves, one waits while
the other runs alone.
A cache point after a deterministic stage removes it and every node before it from
epochs after the first: the total over ``E`` epochs of ``B`` batches is
``B / r_first + (E - 1) * B / r_later``, plus, for each epoch that starts the loader's
worker processes (every one, unless a later epoch replays a cache or the workers are kept
between epochs: :func:`kept_workers`), their start-up and their stop at its end
(:func:`worker_bounds`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placer.data.stream import StreamProfile, StreamSettings
from placer.stream.chain import (alternating, cache_bytes, cache_index, chain, epoch_fill, in_turn,
                                 in_worker_processes, in_workers, kept_workers, loader_thread_speedup, node_costs,
                                 remote_costs, worker_bounds)
from placer.stream.rates import SPINNING, Rate, contended, gil_share, rates

__all__ = ["SPINNING", "StreamPrediction", "alternating", "chain", "gil_share", "in_worker_processes",
           "loader_thread_speedup", "node_costs", "predict"]



@dataclass
class StreamPrediction:
    """A stream's predicted throughput under one placement and configuration.

    ``rates`` are the resources of the first epoch, slowest first; ``later_rates``
    those of epochs after the first when a cache point removes nodes (else equal).
    """

    samples_per_s: float
    batches_per_s: float
    bottleneck: str
    rates: list[Rate]
    later_batches_per_s: float
    later_bottleneck: str
    total_s: float | None = None
    epochs: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def mean_samples_per_s(self) -> float:
        """Samples per second over all epochs (the steady rate without epochs or batch counts)."""
        return self.samples_per_s if self.total_s is None else self._samples / self.total_s

    _samples: float = 0.0

    def rate_of(self, member: str) -> Rate | None:
        """The resource a member belongs to (its stage rate, or its accelerator)."""
        return next((r for r in self.rates if member in r.members and r.kind in ("stage", "device")), None)


def predict(profile: StreamProfile, placement: dict[str, str], config: StreamSettings,
            epochs: int | None = None) -> StreamPrediction:
    """The predicted throughput (and total time over ``epochs``) of one placement and configuration.

    Parameters
    ----------
    profile : StreamProfile
    placement : dict
        Member → device (members not named run on the CPU).
    config : StreamConfig
        Workers, worker kinds, pinned copies and the cache point (prefetch does not
        enter the steady state: it only has to keep every worker fed).
    epochs : int, optional
        Epochs for the total time (default: the source's).
    """
    notes: list[str] = []
    nodes = chain(profile, placement)
    costs = node_costs(profile, nodes, config.pin_memory, notes, config.torch_threads)
    if profile.cluster is not None:
        costs = remote_costs(profile, nodes, costs, config)
    costs = in_workers(profile, nodes, costs, config)
    first = in_turn(profile, nodes, costs, config) if config.sequential else costs
    bps, neck, rs, used = contended(profile, nodes, first, config)
    if not config.sequential:
        bps = max(bps, alternating(profile, nodes, costs, config))
    later_bps, later_neck = bps, neck
    fill = later_fill = epoch_fill(profile, nodes, used, bps, config)
    at = cache_index(nodes, config.cache)
    loader_later = True  # later epochs start the source's loader again (not when they replay a cache)
    if at is not None:
        batches = profile.batches_per_epoch or 0
        if cache_bytes(profile, nodes, at) * batches > config.cache_bytes:
            notes.append(f"the cache after {config.cache!r} would exceed {config.cache_bytes:,} bytes; "
                         "later epochs recompute it")
        elif at == 0 and nodes[0].kind == "source":  # by sample: each later epoch reads them back
            read = profile.stage(nodes[0].name).cached_read_s or 0.0
            later_bps, later_neck, _, out = contended(profile, nodes, [(read, read), *costs[1:]], config,
                                                       decode=False)
            later_fill = epoch_fill(profile, nodes, out, later_bps, config)
        else:
            later_bps, later_neck, _, out = contended(profile, nodes[at + 1:], costs[at + 1:], config)
            later_fill = epoch_fill(profile, nodes[at + 1:], out, later_bps, config)
            loader_later = False
    e = profile.epochs if epochs is None else epochs
    spb = profile.samples_per_batch
    pred = StreamPrediction(samples_per_s=bps * spb, batches_per_s=bps, bottleneck=neck, rates=rs,
                      later_batches_per_s=later_bps, later_bottleneck=later_neck, epochs=e, notes=notes)
    if profile.batches_per_epoch:
        b = profile.batches_per_epoch
        later = (e - 1) * (b / later_bps + later_fill) if later_bps != float("inf") else 0.0
        starts = e if loader_later and not kept_workers(profile, config) else min(e, 1)
        pred.total_s = b / bps + fill + later + starts * worker_bounds(profile, nodes, config)
        pred._samples = e * b * spb
    return pred
