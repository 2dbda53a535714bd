"""The torch_xla adapter's tests (``xla_pcache.torch_xla``), run in the torch_xla venvs."""
