"""``ledger demo``: the whole product on embedded defaults, with faults, in one command.

Starts (or reuses) the local broker, creates the topics, starts two ``ledger worker``
processes, ``ledger project``, ``ledger dashboard`` and the fake receivers; publishes runs
with deliveries over every channel (a browser form every ``BROWSER_EVERY`` runs) while the
receivers inject timeouts, 500-after-accept and rejects, and one worker is SIGKILLed
mid-way; then prints what each receiver got.

One module a part: ``options`` (what the demo was asked, the names its parts share),
``assembly`` (the stack: fakes, workers, projector, dashboard), ``runs`` (what it
publishes), ``chaos`` (the loop: a worker killed, exited ones restarted, until settled),
``receipts`` (what each fake receiver got), ``summary`` (the numbers it ends with) and
``run`` (``run_demo``: all of it, everything stopped at the end).
"""
