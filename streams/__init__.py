"""Stream processors: the delivery state machine, the sender, timers, channel adapters."""
