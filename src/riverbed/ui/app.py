"""The console's web app: pages (Jinja2 + htmx), their JSON, ``/metrics``, actions.

(Over 600 lines: one route table — each page, its ``/api`` twin and its action handlers
beside each other, all thin over :mod:`riverbed.inspect`; split per page when it grows.)

Every page has a JSON twin under ``/api`` (the same query-layer call) and names the
CLI command that prints it. Pages poll themselves with htmx (``every 2s``): the server
answers an htmx request with the page's live part only. Nothing is loaded from another
origin (``Content-Security-Policy: default-src 'self'``): htmx and uPlot are vendored
under ``static/vendor`` with their licences.
"""

from __future__ import annotations

import hmac
import itertools
import json
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

import riverbed.inspect as q
from riverbed.durations import epoch_ms
from riverbed.errors import RiverbedError
from riverbed.jobs.spec import format_work_ids
from riverbed.ui.console import Console
from riverbed.ui.metrics import CONTENT_TYPE, exposition, families

HERE = Path(__file__).parent
CSP = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
COOKIE = "riverbed_ui_token"
PAGES = [
    ("/", "Overview"),
    ("/topics", "Topics"),
    ("/groups", "Consumer groups"),
    ("/streams", "Streams"),
    ("/state", "State"),
    ("/control", "Control"),
    ("/hosts", "Hosts"),
    ("/jobs", "Jobs"),
]
JOB_STATES = (
    "MASTER",
    "PENDING",
    "QUEUED",
    "RUNNING",
    "DONE",
    "FAILED",
    "UPSTREAM_FAILED",
    "CANCELED",
    "SPLIT",
)


# -- template helpers ---------------------------------------------------------------------


def _ts(value: float | None) -> str:
    if not value:
        return "—"
    return datetime.fromtimestamp(value, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ms_ts(value: float | None) -> str:
    return _ts(value / 1000) if value else "—"


def _size(value: float | None) -> str:
    if value is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _spark(points: list[tuple[float, float]], width: int = 120, height: int = 24) -> str:
    """An SVG polyline's points for a sparkline (scaled into width x height)."""
    if len(points) < 2:
        return ""
    t0, t1 = points[0][0], points[-1][0]
    values = [v for _, v in points]
    lo, hi = min(values), max(values)
    span_t = (t1 - t0) or 1.0
    span_v = (hi - lo) or 1.0
    return " ".join(
        f"{(t - t0) / span_t * width:.1f},{height - (v - lo) / span_v * (height - 2) - 1:.1f}"
        for t, v in points
    )


def _rates(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A counter's points as per-second rates between neighbours (for a sparkline)."""
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t1 > t0:
            out.append((t1, max(0.0, v1 - v0) / (t1 - t0)))
    return out


def templates() -> Jinja2Templates:
    t = Jinja2Templates(directory=str(HERE / "templates"))
    t.env.filters.update(
        ts=_ts,
        ms_ts=_ms_ts,
        size=_size,
        num=_num,
        duration=_duration,
        spark=_spark,
        rates=_rates,
        ids=format_work_ids,
        tojson_attr=lambda v: json.dumps(v, default=str),
    )
    t.env.globals.update(PAGES=PAGES, JOB_STATES=JOB_STATES)
    return t


# -- the app --------------------------------------------------------------------------------


class ConsoleApp:
    """The pages and endpoints over one :class:`Console`."""

    def __init__(
        self,
        console: Console,
        *,
        token: str | None = None,
        allow_actions: bool = False,
        jobs_dir: Path | None = None,
    ) -> None:
        self.console = console
        self.src = console.sources
        self.token = token
        self.allow_actions = allow_actions
        self.jobs_dir = jobs_dir
        self.csrf = secrets.token_urlsafe(24)
        self.t = templates()
        self._live: dict[tuple[str, int | None, str | None], Any] = {}
        self._live_lock = threading.Lock()

    # -- plumbing --------------------------------------------------------------------------

    def page(self, request: Request, name: str, title: str, command: str, **data: Any) -> Response:
        """A page; to an htmx poll, only its live part."""
        partial = request.headers.get("HX-Request") == "true"
        context = {
            "title": title,
            "command": command,
            "partial": partial,
            "path": request.url.path,
            "query": request.url.query,
            "allow_actions": self.allow_actions,
            "csrf": self.csrf,
            "now": time.time(),
            **data,
        }
        return self.t.TemplateResponse(request, name, context)

    def error_page(self, request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith(("/api/", "/actions/")):
            return JSONResponse({"error": message}, status_code=status)
        return self.t.TemplateResponse(
            request,
            "error.html",
            {"title": "Error", "message": message, "status": status, "partial": False,
             "command": "", "path": request.url.path, "query": ""},
            status_code=status,
        )  # fmt: skip

    async def guard(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        """Token (when set), then the page; every answer carries the security headers."""
        response = await self._checked(request, call_next)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Frame-Options"] = "DENY"
        return response

    async def _checked(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if self.token is not None and not request.url.path.startswith("/static/"):
            offered = request.query_params.get("token")
            if offered is not None and hmac.compare_digest(offered, self.token):
                # the link with ?token= was opened: keep it in a cookie, drop it from the URL
                rest = {k: v for k, v in request.query_params.items() if k != "token"}
                url = request.url.path + (f"?{urlencode(rest)}" if rest else "")
                response: Response = RedirectResponse(url, status_code=303)
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
                return response
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            cookie = request.cookies.get(COOKIE, "")
            if not any(hmac.compare_digest(c, self.token) for c in (bearer, cookie) if c):
                return PlainTextResponse(
                    "this console needs its token: open it as /?token=TOKEN (the --token or "
                    "RIVERBED_UI_TOKEN it was started with), or send 'Authorization: Bearer "
                    "TOKEN'\n",
                    status_code=401,
                )
        try:
            return await call_next(request)
        except q.QueryError as exc:
            return self.error_page(request, 404, str(exc))
        except (RiverbedError, ValueError) as exc:
            return self.error_page(request, 400, str(exc))

    def _int(self, request: Request, name: str, default: int | None = None) -> int | None:
        raw = request.query_params.get(name, "").strip()
        if raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise q.QueryError(f"{name}={raw!r} is not a whole number") from None

    # -- overview --------------------------------------------------------------------------

    def overview(self, request: Request) -> Response:
        return self.page(
            request, "overview.html", "Overview", "riverbed status --json",
            o=self.console.overview(),
        )  # fmt: skip

    def api_overview(self, request: Request) -> Response:
        return JSONResponse(_plain(self.console.overview()))

    # -- topics ----------------------------------------------------------------------------

    def topics(self, request: Request) -> Response:
        s = self.console.latest()
        return self.page(
            request, "topics.html", "Topics", "riverbed topic list --json",
            topics=s["topics"], at=s["at"], objects=s.get("objects"),
        )  # fmt: skip

    def api_topics(self, request: Request) -> Response:
        return JSONResponse(_plain(self.console.latest()["topics"]))

    def _browse(self, request: Request, name: str) -> dict[str, Any] | None:
        p = request.query_params
        if "partition" not in p:
            return None
        at = p.get("time", "").strip()
        at_ms = None
        if at:
            try:
                parsed = datetime.fromisoformat(at)
            except ValueError:
                raise q.QueryError(f"time={at!r} is not ISO 8601 (e.g. 2026-11-20T10:00)") from None
            parsed = parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
            at_ms = epoch_ms(parsed)
        return q.browse(
            self.src,
            name,
            self._int(request, "partition", 0) or 0,
            offset=self._int(request, "offset"),
            at_ms=at_ms,
            key=p.get("key") or None,
            where=p.get("where") or None,
            limit=min(500, self._int(request, "limit", 50) or 50),
            scan=min(1_000_000, self._int(request, "scan", 10_000) or 10_000),
        )

    def topic(self, request: Request) -> Response:
        name = request.path_params["name"]
        info = q.topic(self.src, name)
        browse = self._browse(request, name)
        return self.page(
            request, "topic.html", f"Topic {name}", f"riverbed topic describe {name} --json",
            topic=info, browse=browse, params=dict(request.query_params),
        )  # fmt: skip

    def api_topic(self, request: Request) -> Response:
        return JSONResponse(_plain(q.topic(self.src, request.path_params["name"])))

    def api_records(self, request: Request) -> Response:
        name = request.path_params["name"]
        if "partition" not in request.query_params:
            raise q.QueryError("name a partition: ?partition=N (and offset, time, key, where)")
        return JSONResponse(_plain(self._browse(request, name)))

    # -- groups ----------------------------------------------------------------------------

    def groups(self, request: Request) -> Response:
        s = self.console.latest()
        return self.page(
            request, "groups.html", "Consumer groups", "riverbed group list --json",
            groups=s["groups"], at=s["at"],
        )  # fmt: skip

    def api_groups(self, request: Request) -> Response:
        return JSONResponse(_plain(self.console.latest()["groups"]))

    def group(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in q.group_names(self.src):
            raise q.QueryError(f"no consumer group '{name}' (groups: "
                               f"{', '.join(q.group_names(self.src)) or 'none'})")  # fmt: skip
        info = q.group(self.src, name)
        trend = self.console.trends.get(f"group/{name}")
        return self.page(
            request, "group.html", f"Group {name}", f"riverbed group describe {name} --json",
            group=info, trend=trend.points if trend else [],
        )  # fmt: skip

    def api_group(self, request: Request) -> Response:
        return JSONResponse(_plain(q.group(self.src, request.path_params["name"])))

    # -- streams ---------------------------------------------------------------------------

    def streams(self, request: Request) -> Response:
        s = self.console.latest()
        return self.page(
            request, "streams.html", "Streams", "riverbed stream status --json",
            streams=s["streams"], joins=s.get("joins", []), at=s["at"],
        )  # fmt: skip

    def api_streams(self, request: Request) -> Response:
        return JSONResponse(_plain(self.console.latest()["streams"]))

    def stream(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name in q.join_names(self.src):  # a stream-stream join: its sides
            joined = q.join(self.src, name)
            kind = "Join" if joined.get("select") is None else "Select"  # (a one-sided join)
            return self.page(
                request, "join.html", f"{kind} {name}",
                f"riverbed stream status {joined['spec'] or name + '.py'} --json", j=joined,
            )  # fmt: skip
        info = q.stream(self.src, name, ledger=30)
        return self.page(
            request, "stream.html", f"Stream {name}",
            f"riverbed stream status {name} --json",
            s=info, batch=self._int(request, "batch"),
        )  # fmt: skip

    def api_stream(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name in q.join_names(self.src):
            return JSONResponse(_plain(q.join(self.src, name)))
        return JSONResponse(_plain(q.stream(self.src, name, ledger=100)))

    def api_live(self, request: Request) -> Response:
        """Live values, restored from durable state: cached per (aggregation, batch asked,
        newest batch), so open pages polling it cost one restore per committed batch."""
        name = request.path_params["name"]
        batch = self._int(request, "batch")
        key = (name, batch, q.newest_batch(self.src, name))
        with self._live_lock:
            answer = self._live.get(key)
        if answer is None:
            answer = _plain(q.live(self.src, name, batch))
            with self._live_lock:
                if len(self._live) > 64:
                    self._live.clear()
                self._live[key] = answer
        return JSONResponse(answer)

    # -- state -----------------------------------------------------------------------------

    def state(self, request: Request) -> Response:
        s = self.console.latest()
        return self.page(
            request, "state.html", "State", "riverbed state ls --json",
            namespaces=s["state"], at=s["state_at"],
        )  # fmt: skip

    def api_state(self, request: Request) -> Response:
        return JSONResponse(_plain(self.console.latest()["state"]))

    def state_keys(self, request: Request) -> Response:
        ns = request.path_params["namespace"]
        keys = self._keys(request, ns)
        info = next((n for n in self.console.latest()["state"] if n["namespace"] == ns), None)
        return self.page(
            request, "state_keys.html", f"State {ns}", f"riverbed state dump {ns} --json",
            ns=info, keys=keys, params=dict(request.query_params),
        )  # fmt: skip

    def _keys(self, request: Request, ns: str) -> dict[str, Any]:
        return q.state_keys(
            self.src,
            ns,
            version=self._int(request, "version"),
            partition=self._int(request, "partition"),
            prefix=request.query_params.get("prefix", ""),
            limit=min(1000, self._int(request, "limit", 100) or 100),
        )

    def api_state_keys(self, request: Request) -> Response:
        return JSONResponse(_plain(self._keys(request, request.path_params["namespace"])))

    # -- control ---------------------------------------------------------------------------

    def control(self, request: Request) -> Response:
        return self.page(
            request, "control.html", "Control", "riverbed control status --json",
            c=q.control(self.src),
        )  # fmt: skip

    def api_control(self, request: Request) -> Response:
        return JSONResponse(_plain(q.control(self.src)))

    # -- hosts -----------------------------------------------------------------------------

    def hosts(self, request: Request) -> Response:
        return self.page(
            request, "hosts.html", "Hosts", "riverbed control hosts --json",
            h=q.hosts(self.src),
        )  # fmt: skip

    def api_hosts(self, request: Request) -> Response:
        return JSONResponse(_plain(q.hosts(self.src)))

    # -- jobs ------------------------------------------------------------------------------

    def _state_filter(self, request: Request) -> str | None:
        wanted = request.query_params.get("state", "").strip().upper() or None
        if wanted is not None and wanted not in JOB_STATES:
            raise q.QueryError(f"state={wanted!r}: one of {', '.join(JOB_STATES)}")
        return wanted

    def jobs(self, request: Request) -> Response:
        wanted = self._state_filter(request)
        info = q.jobs(self.src, wanted, limit=min(500, self._int(request, "limit", 100) or 100))
        suffix = f" --state {wanted}" if wanted else ""
        return self.page(
            request, "jobs.html", "Jobs", f"riverbed jobs list{suffix} --json",
            j=info, state=wanted,
        )  # fmt: skip

    def api_jobs(self, request: Request) -> Response:
        info = q.jobs(
            self.src, self._state_filter(request), self._int(request, "limit", 100) or 100
        )
        return JSONResponse(_plain(info))

    def run(self, request: Request) -> Response:
        run_id = int(request.path_params["id"])
        info = self._run(request, run_id)
        return self.page(
            request, "run.html", f"Run {run_id}", f"riverbed jobs show {run_id} --json", r=info
        )

    def _run(self, request: Request, run_id: int) -> dict[str, Any]:
        offset = self._int(request, "offset", 0) or 0
        limit = min(1000, self._int(request, "limit", 200) or 200)
        return q.run(self.src, run_id, offset, limit)

    def api_run(self, request: Request) -> Response:
        return JSONResponse(_plain(self._run(request, int(request.path_params["id"]))))

    def chunk(self, request: Request) -> Response:
        chunk_id = int(request.path_params["id"])
        info = q.chunk(self.src, chunk_id)
        return self.page(
            request, "chunk.html", f"Chunk {chunk_id}", f"riverbed jobs show {chunk_id} --json",
            c=info,
        )  # fmt: skip

    def api_chunk(self, request: Request) -> Response:
        return JSONResponse(_plain(q.chunk(self.src, int(request.path_params["id"]))))

    def api_chunk_log(self, request: Request) -> Response:
        info = q.chunk_log(
            self.src,
            int(request.path_params["id"]),
            int(request.path_params["attempt"]),
            self._int(request, "offset", 0) or 0,
        )
        return JSONResponse(info)

    # -- metrics ---------------------------------------------------------------------------

    def metrics(self, request: Request) -> Response:
        return Response(exposition(families(self.console.latest())), media_type=CONTENT_TYPE)

    # -- actions ---------------------------------------------------------------------------

    async def action(self, request: Request) -> Response:
        if not self.allow_actions:
            return JSONResponse(
                {"error": "actions are off: this console is read-only; start it with "
                          "`riverbed ui --allow-actions` to cancel or rerun from the page"},
                status_code=403,
            )  # fmt: skip
        form = await _form(request)
        offered = str(form.get("csrf", ""))
        if not hmac.compare_digest(offered, self.csrf):
            return JSONResponse(
                {"error": "missing or stale CSRF token: reload the page and try again"},
                status_code=403,
            )
        from starlette.concurrency import run_in_threadpool

        if "name" in request.path_params:  # a consumer group's offsets
            message = await run_in_threadpool(
                self._reset, request.path_params["name"], form.get("to", ""), form.get("topic")
            )
        else:
            what = request.path_params["what"]
            message = await run_in_threadpool(self._act, what, int(request.path_params["id"]))
        back = str(form.get("back", "")) or "/jobs"
        if not back.startswith("/") or back.startswith("//"):
            back = "/jobs"
        if request.headers.get("Accept", "").startswith("application/json"):
            return JSONResponse({"ok": True, "message": message})
        return RedirectResponse(back, status_code=303)

    def _reset(self, group: str, to: str, topic: str | None) -> str:
        from riverbed.log.group.consumer import reset_offsets

        new = reset_offsets(self.src.log, self.src.control, group, to, topic or None)
        return f"group {group} reset: " + ", ".join(f"{tp} → {o}" for tp, o in new.items())

    def _act(self, what: str, target: int) -> str:
        from riverbed.jobs.queue import JobQueue

        queue = JobQueue(self.src.config.jobs_db_url, create=False)
        try:
            if what == "cancel":
                counts = queue.cancel(target)
                return f"cancelled {target}: {counts}"
            if what == "rerun":
                from riverbed.jobs import Catalog
                from riverbed.jobs.runs import rerun

                jobs_dir = self.jobs_dir or self.src.config.jobs_dir
                new = rerun(Catalog(Path(jobs_dir)), queue, target)
                return f"rerun of {target}: run {new}"
            raise q.QueryError(f"unknown action {what!r}: cancel or rerun")
        finally:
            queue.close()

    # -- routes ----------------------------------------------------------------------------

    def routes(self) -> list[Any]:
        r = [
            Route("/", self.overview),
            Route("/api/overview", self.api_overview),
            Route("/topics", self.topics),
            Route("/api/topics", self.api_topics),
            Route("/topics/{name}", self.topic),
            Route("/api/topics/{name}", self.api_topic),
            Route("/api/topics/{name}/records", self.api_records),
            Route("/groups", self.groups),
            Route("/api/groups", self.api_groups),
            Route("/groups/{name}", self.group),
            Route("/api/groups/{name}", self.api_group),
            Route("/streams", self.streams),
            Route("/api/streams", self.api_streams),
            Route("/streams/{name}", self.stream),
            Route("/api/streams/{name}", self.api_stream),
            Route("/api/streams/{name}/live", self.api_live),
            Route("/state", self.state),
            Route("/api/state", self.api_state),
            Route("/state/{namespace}", self.state_keys),
            Route("/api/state/{namespace}/keys", self.api_state_keys),
            Route("/control", self.control),
            Route("/api/control", self.api_control),
            Route("/hosts", self.hosts),
            Route("/api/hosts", self.api_hosts),
            Route("/jobs", self.jobs),
            Route("/api/jobs", self.api_jobs),
            Route("/jobs/runs/{id:int}", self.run),
            Route("/api/jobs/runs/{id:int}", self.api_run),
            Route("/jobs/chunks/{id:int}", self.chunk),
            Route("/api/jobs/chunks/{id:int}", self.api_chunk),
            Route("/api/jobs/chunks/{id:int}/log/{attempt:int}", self.api_chunk_log),
            Route("/metrics", self.metrics),
            Route("/actions/jobs/{id:int}/{what}", self.action, methods=["POST"]),
            Route("/actions/groups/{name}/reset", self.action, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ]
        return r


def _plain(value: Any) -> Any:
    """JSON-ready (tuples to lists, odd scalars to text)."""
    return json.loads(json.dumps(value, default=str))


def create_app(
    console: Console,
    *,
    token: str | None = None,
    allow_actions: bool = False,
    jobs_dir: Path | None = None,
    sample: bool = True,
) -> Starlette:
    """The ASGI app. With ``sample`` the console's sampler runs while the app does."""
    from collections.abc import AsyncIterator
    from contextlib import asynccontextmanager

    ui = ConsoleApp(console, token=token, allow_actions=allow_actions, jobs_dir=jobs_dir)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if sample:
            console.start()
        try:
            yield
        finally:
            console.stop()

    app = Starlette(routes=ui.routes(), lifespan=lifespan)

    async def not_found(request: Request, exc: Exception) -> Response:
        return ui.error_page(request, 404, f"no page at {request.url.path}")

    app.add_exception_handler(404, not_found)
    from starlette.middleware.base import BaseHTTPMiddleware

    app.add_middleware(BaseHTTPMiddleware, dispatch=ui.guard)
    app.state.ui = ui
    return app


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form (what the pages' action buttons post); no multipart needed."""
    from urllib.parse import parse_qsl

    body = (await request.body()).decode("utf-8", "replace")
    return dict(parse_qsl(body, keep_blank_values=True))
