"""Coverage-guided fuzz targets (atheris), test tooling kept apart from the product.

One module per target, each with ``fuzz_one(data: bytes) -> None`` (raises on a finding:
an unexpected exception type, a hang, a broken invariant) and a ``main`` that runs it
under atheris.  ``fuzz_one`` never needs atheris: tests/unit/test_fuzz_corpus.py replays
every file of ``fuzz/corpus/<target>/`` through it in the normal suite.  How to run it and
what each target checks: docs/testing.md "Fuzzing".
"""
