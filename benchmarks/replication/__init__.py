"""The replication study: ``python -m benchmarks.replication.<name>`` (plan, run, report); docs/replication.md."""
