"""Connecting to a dask.distributed scheduler, and the errors a cluster raises.

May import: placer.errors; distributed inside functions.

:func:`connect` checks an address before contacting anything
(:func:`check_address`), gives up after :data:`CONNECT_TIMEOUT_S` seconds, and turns
any error raised after the scheduler went away into one :class:`SchedulerLostError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from placer.errors import DeviceError

#: seconds to wait for the scheduler when connecting by address
CONNECT_TIMEOUT_S = 10.0
#: seconds to wait for a client to close (a lost scheduler must not hold the exit up)
CLOSE_TIMEOUT_S = 2.0


class ClusterError(DeviceError):
    """The cluster cannot run the pipeline (unreachable, or lacks a device a stage needs)."""


class SchedulerUnreachableError(ClusterError):
    """No dask scheduler answered at the address within the timeout."""


class SchedulerAddressError(ClusterError, ValueError):
    """The scheduler address is malformed (a usage error: nothing was contacted)."""


class ClusterProfileError(ClusterError):
    """Profiling the pipeline on a worker failed (planning for the cluster)."""


# -- connecting -----------------------------------------------------------------------
def check_address(scheduler: str) -> str:
    """``scheduler`` as an address dask can connect to (``tcp://`` by default), checked without connecting.

    Raises
    ------
    SchedulerAddressError
        Naming what is wrong (no port, an ``http://`` dashboard address, an unknown
        scheme) and the form to use.
    """
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    address = scheduler.strip() if isinstance(scheduler, str) else scheduler
    form = "give the scheduler's address as tcp://HOST:PORT (the one `dask scheduler` prints; default port 8786)"
    if not isinstance(address, str) or not address:
        raise SchedulerAddressError(f"scheduler address {scheduler!r} is empty or not a string; {form}")
    if any(c.isspace() for c in address):
        raise SchedulerAddressError(f"scheduler address {address!r} contains spaces; {form}")
    scheme, loc = parse_address(address, strict=False)
    if scheme in ("http", "https"):
        raise SchedulerAddressError(
            f"scheduler address {address!r} is a web (dashboard) address; the scheduler itself listens "
            f"on another port: {form}")
    if scheme not in backends:
        raise SchedulerAddressError(
            f"scheduler address {address!r} has the unknown scheme {scheme!r} (dask knows "
            f"{', '.join(sorted(backends))}); {form}")
    if scheme != "inproc":
        try:
            host, port = parse_host_port(loc)
        except (ValueError, TypeError) as exc:
            raise SchedulerAddressError(f"scheduler address {address!r} is not HOST:PORT ({exc}); {form}") from None
        if not host or not 0 < int(port) < 65536:
            raise SchedulerAddressError(f"scheduler address {address!r} has no host or a port outside 1-65535; {form}")
    return address if "://" in address else f"{scheme}://{address}"


@contextlib.contextmanager
def connect(scheduler: Any, *, timeout: float | None = None) -> Iterator[Any]:
    """A :class:`distributed.Client` for ``scheduler`` (an address or a Client).

    A Client passed in is used as it is and left open; one made here from an
    address is closed on exit. ``timeout`` defaults to :data:`CONNECT_TIMEOUT_S`.

    Raises
    ------
    SchedulerAddressError
        When the address is malformed (checked before anything is contacted).
    SchedulerUnreachableError
        When no scheduler answers at the address within ``timeout`` seconds.
    """
    from distributed import Client

    if isinstance(scheduler, Client):
        with _lost_scheduler(scheduler, str(scheduler.scheduler.address)):
            yield scheduler
        return
    if not isinstance(scheduler, str):
        raise SchedulerAddressError(
            f"scheduler must be an address like tcp://HOST:8786 or a distributed.Client, "
            f"got {scheduler!r}"
        )
    address = check_address(scheduler)
    timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
    with _quiet_client_log():
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as exc:
            raise SchedulerUnreachableError(
                f"cannot reach the dask scheduler at {address} within {timeout:g} s "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no answer'}); "
                "start one with `dask scheduler` and check the address and port"
            ) from None
        try:
            with _lost_scheduler(client, address):
                yield client
        finally:
            with contextlib.suppress(Exception):
                client.close(timeout=CLOSE_TIMEOUT_S)


class SchedulerLostError(ClusterError):
    """The connection to the scheduler was lost while placer used the cluster."""


def scheduler_lost(client: Any) -> bool:
    """Whether ``client`` has lost its scheduler (reconnecting, or closed because it could not)."""
    return getattr(client, "status", "running") in ("connecting", "closing", "closed")


@contextlib.contextmanager
def _lost_scheduler(client: Any, address: str) -> Iterator[None]:
    """Any error raised in the block after the scheduler went away becomes one :class:`SchedulerLostError`."""
    try:
        yield
    except SchedulerLostError:
        raise
    except Exception as exc:
        if not scheduler_lost(client):
            raise
        stage = getattr(exc, "stage", None)
        during = f" while stage {stage!r} ran" if stage else ""
        err = SchedulerLostError(
            f"lost the connection to the dask scheduler at {address}{during}; the run stopped "
            "(the outputs held on the workers are gone with it); check that the scheduler is running "
            "and run again",
            stage=stage,
        )
        err.run = getattr(exc, "run", None)
        raise err from None


class _DropClientErrors:
    """A logging filter: drops distributed.client's own report of a lost scheduler (placer raises one error)."""

    def filter(self, record: Any) -> bool:
        return record.levelno < 40  # ERROR and above: the reconnect failure, said once by placer instead


@contextlib.contextmanager
def _quiet_client_log() -> Iterator[None]:
    import logging

    log = logging.getLogger("distributed.client")
    f = _DropClientErrors()
    log.addFilter(f)
    try:
        yield
    finally:
        log.removeFilter(f)
