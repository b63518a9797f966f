"""The MCP server: the ledger's tools and a run's timeline as a resource, on the official SDK's
low-level ``Server`` (so every input error is worded here, in one line, never the input
echoed), served over stdio or streamable HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

from api.errors import validation_problem
from clients.tracing import span
from events.base import RUN_ID_PATTERN
from events.ports import listening_socket
from events.redaction import redacted_data, redacted_text
from ledger.mcp_server.tools import (
    Answer,
    LedgerTools,
    ListUnknown,
    PublishRunResult,
    Redrive,
    Resolve,
    ToolRefused,
    Which,
)
from receiver.uvicorn_server import serve_on

log = logging.getLogger("ledger.mcp")
NAME = "delivery-ledger"
TIMELINE_PREFIX, TIMELINE_SUFFIX = "ledger://runs/", "/timeline"
TIMELINE_TEMPLATE = f"{TIMELINE_PREFIX}{{run_id}}{TIMELINE_SUFFIX}"
INSTRUCTIONS = (
    "delivery-ledger keeps two facts per agent run: did execution finish, and did each "
    "notification really arrive. Publish a finished run with publish_run_result; ask "
    "delivery_status whether its deliveries arrived. UNKNOWN means nobody knows yet whether "
    "the receiver got it: never report it as delivered; the ledger looks it up by its key."
)


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its input model (its JSON Schema is the tool's), what it does, whether it
    only reads, and whether it is an operator's (off without --operator)."""

    model: type[BaseModel]
    run: Callable[[LedgerTools, Any], Awaitable[Answer]]
    description: str
    read_only: bool
    operator: bool = False


SPECS: dict[str, ToolSpec] = {
    "publish_run_result": ToolSpec(
        PublishRunResult,
        LedgerTools.publish_run_result,
        "Record that a run succeeded with its result, and the deliveries (notifications) "
        "that follow from it, in one Kafka transaction. Idempotent by run id: the same call "
        "again returns the first answer; a different one for the same run id is refused. "
        "Returns each delivery's idempotency key (what identifies it at the receiver).",
        read_only=False,
    ),
    "delivery_status": ToolSpec(
        Which,
        LedgerTools.delivery_status,
        "By run id or idempotency key: did execution finish, did each delivery leave "
        "(PENDING, SENT, UNKNOWN, CONFIRMED, FAILED; UNKNOWN is not a success), and which "
        "key identifies it at the receiver, with the receiver's id once confirmed.",
        read_only=True,
    ),
    "list_unknown": ToolSpec(
        ListUnknown,
        LedgerTools.list_unknown,
        "The deliveries whose arrival nobody can tell yet (UNKNOWN), the oldest first.",
        read_only=True,
    ),
    "explain_delivery": ToolSpec(
        Which,
        LedgerTools.explain_delivery,
        "A run's timeline in words (or one delivery's, by its key): requested, claimed, "
        "sent, unknown, looked up, confirmed or failed, and what operators did, in order.",
        read_only=True,
    ),
    "resolve": ToolSpec(
        Resolve,
        LedgerTools.resolve,
        "Operator only: settle a delivery with the receiver's evidence (delivered, "
        "not_delivered, abandoned), as a signed event naming the operator.",
        read_only=False,
        operator=True,
    ),
    "redrive": ToolSpec(
        Redrive,
        LedgerTools.redrive,
        "Operator only: send a FAILED delivery again under the same key (an UNKNOWN is "
        "looked up first), as a signed event naming the operator.",
        read_only=False,
        operator=True,
    ),
}


def refused(text: str) -> types.CallToolResult:
    """A tool error the model reads: one line."""
    line = " ".join(redacted_text(text).split())
    return types.CallToolResult(content=[types.TextContent(text=line)], is_error=True)


def invalid(name: str, exc: ValidationError) -> types.CallToolResult:
    """A validation error as one line naming the argument (never its value)."""
    _, problem = validation_problem(list(exc.errors()))
    error = problem.error
    if error.startswith("body: "):  # about no one argument (one of two is required, say)
        error = error.removeprefix("body: ")
    return refused(f"{name}: invalid arguments: {error}")


def timeline_uri(run_id: str) -> str:
    """The resource URI of a run's timeline (the run id percent-encoded: it may hold '/')."""
    return f"{TIMELINE_PREFIX}{quote(run_id, safe='')}{TIMELINE_SUFFIX}"


def build_server(tools: LedgerTools) -> Server[Any]:
    """The MCP server over ``tools``: resolve and redrive listed only when it has operators."""

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = [
            types.Tool(
                name=name,
                description=spec.description,
                input_schema=spec.model.model_json_schema(),
                annotations=types.ToolAnnotations(
                    read_only_hint=spec.read_only,
                    idempotent_hint=spec.read_only or name == "publish_run_result",
                    destructive_hint=False,
                ),
            )
            for name, spec in SPECS.items()
            if tools.operators or not spec.operator
        ]
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        name = params.name
        spec = SPECS.get(name)
        if spec is None:
            known = ", ".join(n for n, s in SPECS.items() if tools.operators or not s.operator)
            return refused(f"no tool named {name[:100]!r} (tools: {known})")
        try:
            if spec.operator:
                tools.refuse_operator_tool(name)
            given = spec.model.model_validate(params.arguments or {})
        except ValidationError as exc:
            return invalid(name, exc)
        except ToolRefused as exc:
            return refused(str(exc))
        try:
            # A span per tool call (clients/tracing.py): a published run's trace starts here.
            with span(f"ledger.mcp {name}", {"ledger.mcp.tool": name}):
                answer = await spec.run(tools, given)
        except ToolRefused as exc:
            return refused(str(exc))
        except Exception:
            log.exception("tool %s failed", name)
            return refused(f"{name} failed unexpectedly (the server's log has the details)")
        return types.CallToolResult(
            content=[types.TextContent(text=redacted_text(answer.text))],
            structured_content=redacted_data(answer.data),
        )

    async def list_templates(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="run-timeline",
            uri_template=TIMELINE_TEMPLATE,
            description="One run's timeline in words (explain_delivery's answer).",
            mime_type="text/plain",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def list_resources(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        # The timelines worth reading now: the runs with an UNKNOWN delivery.
        try:
            unknown = await tools.list_unknown(ListUnknown(limit=50))
        except ToolRefused:
            return types.ListResourcesResult(resources=[])
        runs = dict.fromkeys(row["run_id"] for row in unknown.data["deliveries"])
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name=f"timeline of run {run_id}",
                    uri=timeline_uri(run_id),
                    description="A run with an UNKNOWN delivery.",
                    mime_type="text/plain",
                )
                for run_id in runs
            ]
        )

    async def read_resource(
        ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        run_id = unquote(uri.removeprefix(TIMELINE_PREFIX).removesuffix(TIMELINE_SUFFIX))
        if (
            not uri.startswith(TIMELINE_PREFIX)
            or not uri.endswith(TIMELINE_SUFFIX)
            or not RUN_ID_PATTERN.match(run_id)
        ):
            raise MCPError(
                types.INVALID_PARAMS,
                f"not a run timeline: resources are {TIMELINE_TEMPLATE} (run id percent-encoded)",
            )
        try:
            answer = await tools.explain_delivery(Which(run_id=run_id))
        except ToolRefused as exc:
            raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=uri, mime_type="text/plain", text=redacted_text(answer.text)
                )
            ]
        )

    return Server(
        NAME,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


async def serve_stdio(tools: LedgerTools) -> None:
    """Serve over this process's stdin and stdout until the client closes them."""
    server = build_server(tools)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await tools.close()


HOST = "127.0.0.1"  # no authentication on this endpoint: never more than this machine


async def serve_http(
    tools: LedgerTools,
    port: int,
    stop: asyncio.Event,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve streamable HTTP at ``http://127.0.0.1:PORT/mcp`` until ``stop`` is set
    (port 0: a free one below the kernel's ephemeral range); ``ready`` gets the URL."""
    app = build_server(tools).streamable_http_app(streamable_http_path="/mcp", host=HOST)
    sock = listening_socket(HOST, port)
    try:
        await serve_on(
            app,
            sock,
            stop,
            ready=None if ready is None else lambda got: ready(f"http://{HOST}:{got}/mcp"),
            lifespan="auto",  # the MCP session manager runs in the app's lifespan
            timeout_graceful_shutdown=5,
        )
    finally:
        await tools.close()
