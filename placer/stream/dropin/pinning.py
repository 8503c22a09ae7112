"""What pinning costs: the CPU the pin-memory thread of a DataLoader's iterator takes, beside what it saves.

May import: psutil (inside functions), placer.stream.dropin.trial.

With ``pin_memory=True`` and worker processes, a DataLoader's iterator runs a thread in the
user's process (``_pin_memory_thread``) that copies each batch the workers send into
page-locked memory, so that its copy to the GPU is faster and need not block. That thread's
CPU seconds come from the cores the step and the loader share. Each run of a pinned setting
reads them (psutil, by the thread's native id) and keeps them as a share of a core over the
run (:attr:`~placer.stream.dropin.trial.Trial.pin_share`); the advice says that share beside
what pinning gained over the same settings unpinned, where both ran, and says when pinning
costs more than it saves (the pinned runs no faster). Without a CUDA device torch pins nothing
and starts no such thread: nothing is read or said.
"""

from __future__ import annotations

from typing import Any

from placer.stream.dropin.trial import Trial, label


def thread_cpu_s(native_id: int | None) -> float | None:
    """CPU seconds (user and system) of this process's thread ``native_id``; None where it is gone or unreadable."""
    if native_id is None:
        return None
    try:
        import psutil

        for t in psutil.Process().threads():
            if t.id == native_id:
                return float(t.user_time + t.system_time)
    except (ImportError, OSError, Exception):  # noqa: BLE001 - psutil.Error and platform errors alike: unread
        return None
    return None


def pin_thread_cpu_s(it: Any) -> float | None:
    """CPU seconds the pin-memory thread of a DataLoader iterator ``it`` has taken (None: it has none)."""
    thread = getattr(it, "_pin_memory_thread", None)
    return None if thread is None else thread_cpu_s(getattr(thread, "native_id", None))


def said(best: Trial, trials: list[Trial]) -> str | None:
    """The advice's sentence on pinning where ``best`` pins with a pin-memory thread measured; None otherwise."""
    if not best.settings.pin_memory or best.pin_share is None:
        return None
    text = f"pin_memory=True: the pin-memory thread took {best.pin_share:.0%} of a core in its runs"
    twin = best.settings.model_copy(update={"pin_memory": False})
    unpinned = next((t for t in trials if t.settings == twin), None)
    if unpinned is None:
        return text + " (the same settings unpinned were not run)"
    gain = best.score / max(unpinned.score, 1e-12)
    if gain < 1.0:
        return (text + f", and the pinned runs measured {gain:.2f}x {label(twin)}: pinning costs more than it "
                "saves here")
    return text + f" for {gain:.2f}x over the same settings unpinned"
