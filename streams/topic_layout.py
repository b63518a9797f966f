"""The worker's topics must agree on their partition count before it starts.

The worker's table is co-partitioned with ``ledger.deliveries``: the state of a delivery
in partition *p* lives in partition *p* of the table's changelog. A changelog left from
another layout (4 partitions beside an 8-partition deliveries topic: a broker reused
after a change of ``LEDGER_KAFKA__PARTITIONS``) crashed the worker inside faust with
"Unrecognized partition", a traceback and a restart loop. Checked here, before faust
starts, it is one line naming both topics and their counts.
"""

from __future__ import annotations

from clients.kafka_security import ensure_reachable
from config.parts import KafkaSettings
from events.errors import ConfigError


def changelog_topic(group: str) -> str:
    """The name faust gives the worker table's changelog (``{app id}-{table}-changelog``)."""
    return f"{group}-delivery-state-changelog"


def layout_error(
    settings: KafkaSettings, changelog: str, counts: dict[str, int]
) -> ConfigError | None:
    """Why the existing topics (``counts``: partitions by topic name) cannot work with
    ``settings``, or None. faust's own rule: a table's changelog has exactly as many
    partitions as its source topic (``PartitionsMismatch`` otherwise; fewer also crashed
    our write-back with "Unrecognized partition")."""
    deliveries = settings.topic_deliveries
    found = counts.get(deliveries)
    if found is not None and found != settings.partitions:
        return ConfigError(
            f"{deliveries} has {found} partitions but LEDGER_KAFKA__PARTITIONS is "
            f"{settings.partitions}: the worker's table would not line up with it",
            f"set LEDGER_KAFKA__PARTITIONS={found} (a topic's partitions are never "
            "changed by the ledger)",
        )
    expected = settings.partitions if found is None else found
    kept = counts.get(changelog)
    if kept is not None and kept != expected:
        return ConfigError(
            f"the worker's changelog {changelog} has {kept} partitions but {deliveries} "
            f"has {expected}: it was left by another layout",
            "start the workers under a new group (LEDGER_WORKER__GROUP): it folds "
            f"{deliveries} from its start into a changelog of {expected} partitions",
        )
    return None


def check_topic_layout(settings: KafkaSettings, changelog: str) -> None:
    """Connect (a ``LedgerError`` if no broker answers), then raise ``ConfigError`` when
    the deliveries topic or the worker's changelog has a partition count the worker
    cannot use; topics not created yet are fine."""
    counts = ensure_reachable(settings, (settings.topic_deliveries, changelog))
    problem = layout_error(settings, changelog, counts)
    if problem is not None:
        raise problem
