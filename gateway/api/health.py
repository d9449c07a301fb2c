"""/healthz and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(request: Request) -> dict[str, object]:
    """Liveness and what the gateway can do right now."""
    state = request.app.state
    return {
        "status": "ok" if state.recorder.journal_healthy else "degraded",
        "journal_writable": state.recorder.journal_healthy,
        "database_reachable": state.recorder.stats.db_healthy,
        # The database writer has started and made its first pass over the journal.
        "recorder_ready": state.recorder.stats.writer_ready,
        "recorder_backlog": state.recorder.backlog,
        # Records the database refused for their data, set aside under <journal>/rejected/.
        "records_rejected": state.recorder.stats.rejected,
        # Where the keys and prices served with came from: database, snapshot (the database
        # was unreachable at start), or none.
        "directory": state.directory.source,
        "models": sorted(state.deployments),
    }


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """The Prometheus exposition, the live gauges refreshed first."""
    state = request.app.state
    state.refresh_gauges()
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
