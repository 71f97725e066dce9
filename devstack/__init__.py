"""Run the stack without Docker: the CPU tritonserver from the PyPI wheel plus the gateway."""
