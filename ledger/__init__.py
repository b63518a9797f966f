"""The ``ledger`` application: CLI, local broker, topic admin, replay, demo."""
