"""The benchmarks: each module runs as ``python -m benchmarks.<name>`` from the repository root; what they
share is in common.py. docs/benchmarks.md lists them with their commands and committed results."""
