"""Imported first by a study: bench/ (the product benchmarks' shared helpers: measure.py, the llm benchmark's timing
and floor) and the tree (services/, protos/) on the import path, wherever the study is started from."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(BENCH.parent / "protos")]
