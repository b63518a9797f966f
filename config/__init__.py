"""delivery-ledger's configuration: one ``Settings`` object (env prefix ``LEDGER_``)."""

from config.settings import Settings

__all__ = ["Settings"]
