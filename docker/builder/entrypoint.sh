#!/bin/sh
# Run the builder CLI; make sure the cache folders exist (fresh named volumes are empty).
set -eu
mkdir -p "${HF_HOME:-/cache/huggingface}" /cache/tensorrt
exec python3 -m builder "$@"
