"""JAX: loading ahead and compiling ahead, one wing of the adapter (docs/jax.md, "Loading
ahead" and "Compiling ahead what is missing").

One session a store (``_prefetch.Prefetch``, a class over the parts it names) is the scheduler
and the pool of both: from the backend's start its threads fetch and load what the run's plan
names (``_plan``, told by ``_recognition``, written by ``_plan_writer``; each load in two
steps, ``_loads``), and what the store lacks they hand to compiling ahead (``_compiling``),
which compiles it from its module record (``_record``, written at JAX's put by ``_recording``)
in a compiler process of the run's own (``_link``, ``_compiler``, speaking ``_protocol``, on a
client of the record's target, ``_target``); what comes back is loaded by the same threads.
JAX's read of a key (``_read_hook``) is served from either, with the same checks; JAX's default
backend is found once it is up (``_backend_wait``). What one JAX compile keeps between the
cache's read and its put is in ``jax._compile_context``, beside the single flight it also
serves.
"""
