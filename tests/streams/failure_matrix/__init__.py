"""The failure matrix (ARCHITECTURE.md): real broker, real ``ledger worker`` processes (a
crash is a real SIGKILL at an exact fault point), the channels' fake providers, which do NOT
dedupe unless a row says so.

``drivers.py`` says per channel how to reach its fake, inject a fault by its generic name and
count what the provider accepted per key; ``stacks.py`` runs a fake, a worker and a live
projection for rows to share; ``test_table.py`` is the table (channel x row) with one body
per row. The rows of one channel only are in ``test_webhook.py``, ``test_browser.py``,
``test_windows.py`` and ``test_clocks.py``.

Webhook rows run twice: against the simulator's plain receiver (no dedupe, so a second send
is a second acceptance) and against receiver-kit apps in their normal mode (``kit``). For
the kit the simulator counts the raw requests in front of it and the handler's runs behind
it, so a row shows both: requests per key, and handler runs per key (exactly 1).
"""
