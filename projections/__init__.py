"""Projections: fold the log into ledger tables; rebuild, verify, dashboards."""
