"""The test suite, a package so that tests/jax and tests/torch_xla import as ``tests.jax`` and
``tests.torch_xla``: as top-level names they would shadow the frameworks they test. Shared
helpers import from here too (``tests.helpers``), never from another test file."""
