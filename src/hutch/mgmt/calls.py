"""What a route handler gets and returns, and the route table the handlers register in.

Owns: `Call` (the node, its management agent, the authenticated caller and the request's parts, as a
handler sees them),
`Status` (a reply without a body: 201, 204, with headers such as `Location`), and `Route`/`ROUTES`/
`route`, the table of API routes. A route carries what the OpenAPI description (openapi.py) says about
it: a summary, the schema of its reply and of its body, and whether it is a list endpoint (which takes
the sorting, filtering, pagination and column parameters of listing.py). http.py serves the table.

Rules:
- A handler is a plain function `(Call) -> JSON-able value | Status`; it raises `ApiError`.
- Every route is registered here, so the OpenAPI description cannot miss one (tests/mgmt/test_openapi.py
  checks that every API route of the app is described).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .access import Principal

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import ManagementAgentPort

    from .stats import StatsView


@dataclass(frozen=True)
class Call:
    """What a handler gets: the node, the authenticated caller and the request's parts."""

    node: Node
    principal: Principal
    params: Mapping[str, str]
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any
    stats: StatsView | None
    now_ms: float
    path: str = ""

    @property
    def agent(self) -> ManagementAgentPort:
        """The node's management agent (runtime/ports.py): what the node holds, as plain data."""
        agent = self.node.agent
        assert agent is not None  # runtime/app.py's build_node sets it
        return agent

    def flag(self, name: str) -> bool:
        return self.query.get(name) == "true"


class Status:
    """A reply with no body (201 Created, 204 No Content), optionally with headers."""

    def __init__(self, code: int, headers: Mapping[str, str] | None = None) -> None:
        self.code = code
        self.headers = dict(headers or {})


class Reply:
    """A JSON reply with a status other than 200 (a failed health check's 503)."""

    def __init__(self, code: int, body: Any) -> None:
        self.code = code
        self.body = body


NO_CONTENT = Status(204)


def created(was_created: bool) -> Status:
    return Status(201) if was_created else NO_CONTENT


Handler = Callable[[Call], Any]


@dataclass(frozen=True)
class Route:
    """One API route. `reply` and `body` name schemas of openapi.py (`"Queue"`, `"Queue[]"`); `listing`
    marks list endpoints; `codes` are the statuses it can answer besides 200/401 (e.g. 201, 204, 404)."""

    method: str
    path: str
    fn: Handler
    summary: str
    tag: str
    reply: str | None = None
    body: str | None = None
    listing: bool = False
    codes: tuple[int, ...] = field(default=())


ROUTES: list[Route] = []


def route(method: str, path: str, summary: str, *, tag: str, reply: str | None = None, body: str | None = None,
          listing: bool = False, codes: tuple[int, ...] = ()) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        ROUTES.append(Route(method, path, fn, summary, tag, reply, body, listing, codes))
        return fn

    return register


__all__ = ["NO_CONTENT", "ROUTES", "Call", "Handler", "Reply", "Route", "Status", "created", "route"]
