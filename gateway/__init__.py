"""HTTP gateway: friendly /classify and /embed JSON APIs over Triton gRPC with shared memory."""
