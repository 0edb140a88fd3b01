"""Benchmark harness of issue 4: checkpointd over gRPC vs a shadow-git baseline. Run with
``python -m tests.bench`` (see run.py); not a test suite, pytest does not collect it."""
