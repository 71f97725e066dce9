"""Zero the GPU code of a shared library that is built for other GPU architectures than `--keep`.

    python3 loadtest/device/prune_fatbin.py libonnxruntime_providers_cuda.so --keep 90

A CUDA library carries one cubin per architecture in its `.nv_fatbin` section (fatbin containers:
a 16-byte header `0xBA55ED50`, then entries, each with its own header holding the kind, the
payload size and the SM version at offset 28). The CUDA driver loads only the entry for the
device's architecture, so the payloads of the others can be zeroed in place: the file keeps its
layout and size and runs unchanged on a `--keep` GPU, but it compresses to a fraction (the
onnxruntime-gpu CUDA provider: 284 MB, 218 MB of it fatbins for sm_75..sm_120; with only sm_90
left it packs to about a third). Used to carry onnxruntime-gpu to the H100/H200 benchmark host
within one device call; never for anything shipped.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
from pathlib import Path

MAGIC = 0xBA55ED50


def fatbin_section(path: Path) -> tuple[int, int]:
    """File offset and size of `.nv_fatbin` (from readelf)."""
    out = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if ".nv_fatbin" in x)
    fields = line.split("]", 1)[1].split()
    return int(fields[3], 16), int(fields[4], 16)


def prune(path: Path, keep: set[int]) -> dict[int, int]:
    """Zero every entry payload whose SM version is not in `keep`; bytes zeroed per SM version."""
    data = bytearray(path.read_bytes())
    offset, size = fatbin_section(path)
    zeroed: dict[int, int] = {}
    pos, end = offset, offset + size
    while pos < end:
        magic, _version, header, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != MAGIC:  # alignment padding between containers
            pos += 8
            continue
        entry, stop = pos + header, pos + header + fat_size
        while entry < stop:
            _kind, _ver, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            if arch not in keep:
                start = entry + entry_header
                data[start : start + payload] = bytes(payload)
                zeroed[arch] = zeroed.get(arch, 0) + payload
            entry += entry_header + payload
        pos = stop
    path.write_bytes(data)
    return zeroed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("--keep", default="90", help="comma list of SM versions to keep (e.g. 90 for H100/H200)")
    args = parser.parse_args()
    zeroed = prune(args.library, {int(a) for a in args.keep.split(",")})
    print(f"{args.library.name}: zeroed " + ", ".join(f"sm_{a} {n / 1e6:.0f} MB" for a, n in sorted(zeroed.items())))


if __name__ == "__main__":
    main()
