"""The dashboard: a web page, its JSON API and Prometheus metrics, over the projection only.

    app = create_app(settings, store)          # an ASGI application (FastAPI)
    await serve(settings, store, stop_event)   # or listen until stopped

Modules: ``overview`` (the page: which answers of ``projections.queries`` it shows, and
how), ``lookup`` (search, one run's page), ``guard`` (Host check, bearer token, binding
and token rules, where a state-changing request comes from: the middleware every request
passes), ``actions`` (the operator's Resolve and Redrive buttons: JSON in, a signed event
appended), ``budgets`` (the budget release), ``errors`` (every refusal: one line and a
hint), ``store_thread`` (the one thread the store is used from, riding database
restarts), ``models`` (the answers' shapes, for the OpenAPI document), ``server``
(routes, serving with uvicorn);
``static/`` holds the page, its script and stylesheet (no CDN: everything ships in the
package).
"""

from events.addresses import is_loopback
from projections.dashboard.guard import check_binding
from projections.dashboard.lookup import run_page, search
from projections.dashboard.overview import COUNTERS, Overview, overview
from projections.dashboard.server import create_app, serve

__all__ = [
    "COUNTERS",
    "Overview",
    "check_binding",
    "create_app",
    "is_loopback",
    "overview",
    "run_page",
    "search",
    "serve",
]
