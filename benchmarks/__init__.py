"""chargen's benchmarks: each module runs as ``python -m benchmarks.NAME`` from the repository root."""
