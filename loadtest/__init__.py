"""Load generator, benchmarks and reports for the Triton + gateway stack (see docs/benchmarks.md)."""
