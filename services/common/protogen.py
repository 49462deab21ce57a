"""Generate the Python stubs for protos/ (`make protos`); tests/test_protos.py checks they are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2] / "protos"


def proto_files(root: Path = PROTO_ROOT) -> list[Path]:
    return sorted((root / "moss" / "speech" / "v1").glob("*.proto"))


def generate(out_dir: Path, root: Path = PROTO_ROOT) -> None:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto under `root` into `out_dir`."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{root}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(root)) for p in proto_files(root)),
    ]
    # protoc resolves the relative file names against -I; run from the root so it finds them.
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
    finally:
        os.chdir(cwd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PROTO_ROOT)
    generate(parser.parse_args().out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
