"""The CLI's tests (``xla_pcache.cli``): its commands run as a user runs them."""
