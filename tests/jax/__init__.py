"""The JAX adapter's tests (``xla_pcache.jax``): real JAX in fresh processes."""
