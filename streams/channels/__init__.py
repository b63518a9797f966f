"""Channel adapters: how a delivery leaves the system, and how its fate is looked up."""
