"""Agents' telemetry over their WebSocket, gathered: one ingest for every message that arrived meanwhile.

Each host's agent sends a batch a second. Over HTTP each batch is a request of its own, and at
1,250 hosts the requests alone (Django's middleware, authentication, a cache round trip to read the
host's map, one INSERT, one to write the hot values, live messages) cost more than two cores
(benchmarks.fleet). An agent that keeps `/ws/agent/telemetry/` open sends the same body as a text
frame instead; the WebSocket process hands every frame that arrives while the previous ingest runs
to the next one, so a busy second is a few ingests of many hosts each
(`ingest.telemetry_ingest_many`), and a quiet one is one ingest per frame, GATHER_SECONDS late at
most. This is group commit, as databases batch the commits of concurrent transactions into one log
write. Each agent waits for its own answer (`ack`) before it sends again, so a slow database slows
the agents down instead of piling frames up here.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.db import OperationalError, connections
from django.utils.translation import gettext as _

from common.errors import ApplicationError
from common.outages import as_service_unavailable
from inventory.models import HostToken
from monitoring import ingest

log = logging.getLogger(__name__)

# The ingests run on a thread of their own, not on the thread every other consumer's database work shares
# (Channels' thread-sensitive default): a host's lease channel opening, or a dashboard's access check,
# must not hold the whole fleet's telemetry behind it, nor one large ingest hold them. One thread: one
# ingest at a time per process, as the gathering means.
_INGEST_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="telemetry-ingest")

# How long the first frame of a quiet moment waits for company: short next to the 1 s between an
# agent's batches and the 250 ms live target, long enough that frames of one busy second share an ingest.
GATHER_SECONDS = 0.02


class Gatherer:
    """One per event loop (one per WebSocket process): frames wait here, and one task ingests them."""

    def __init__(self) -> None:
        self.waiting: list[tuple[HostToken, object, asyncio.Future]] = []
        self.task: asyncio.Task | None = None

    async def ingest(self, token: HostToken, payload) -> ingest.IngestResult:
        """This frame's result, once it has been ingested with whatever else came; raises what refused it."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((token, payload, future))
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        while self.waiting:
            await asyncio.sleep(GATHER_SECONDS)
            taken, self.waiting = self.waiting, []
            try:
                outcomes = await database_sync_to_async(ingest.telemetry_ingest_many, thread_sensitive=False,
                                                        executor=_INGEST_THREAD)([(t, p) for t, p, _f in taken],
                                                                                 note_seen=True)
            except Exception as error:  # noqa: BLE001 - every frame of this ingest gets the error
                outcomes = [error] * len(taken)
            for (_token, _payload, future), outcome in zip(taken, outcomes):
                if future.done():  # its socket closed meanwhile
                    continue
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
            if not self.waiting:
                # Quiet: the thread lets its database connection go (a busy process keeps it between ingests).
                # Frames that arrive meanwhile are taken by this loop, as this task is not done yet.
                await asyncio.get_running_loop().run_in_executor(_INGEST_THREAD, connections.close_all)


_gatherers: dict[asyncio.AbstractEventLoop, Gatherer] = {}


def gatherer() -> Gatherer:
    loop = asyncio.get_running_loop()
    if loop not in _gatherers:
        for stale in [known for known in _gatherers if known.is_closed()]:
            del _gatherers[stale]  # tests run several loops in one process
        _gatherers[loop] = Gatherer()
    return _gatherers[loop]


def refusal(error: BaseException) -> dict:
    """The frame's answer for an error, shaped like the HTTP answer's body: status, and field, rule, message."""
    if not isinstance(error, ApplicationError):
        outage = as_service_unavailable(error)
        if outage is not None:
            error = outage
        elif isinstance(error, OperationalError):  # busy, not gone: as the HTTP view answers it
            error = ingest.StorageBusy(_("Telemetry storage is busy; send this batch again shortly."),
                                       field="batches", rule="busy")
        else:
            log.error("telemetry ingest failed", exc_info=error)
            return {"type": "error", "status": 500, "field": "", "rule": "server_error",
                    "message": _("The portal could not store this batch; send it again.")}
    first = error.errors[0]
    return {"type": "error", "status": error.status, **first.as_dict()}
