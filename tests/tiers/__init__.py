"""The remote tiers' tests (``xla_pcache.tiers``), against real servers on loopback."""
