"""Run every benchmark module (tests/bench/bench_*.py) and print one table of ratios."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def main() -> int:
    """Run the benchmarks named on the command line (default: all) and print their rows."""
    # Measure what users get: Python caching bytecode (the warm-up runs write the .pyc files). Some sandboxes
    # and CI images set PYTHONDONTWRITEBYTECODE, which makes every measured command compile the project again.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    names = sys.argv[1:] or sorted(p.stem for p in Path(__file__).parent.glob("bench_*.py"))
    rows: list[dict[str, object]] = []
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        rows += importlib.import_module(f"tests.bench.{name}").run()
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        print(f"{r['name']!s:<{width}}  {r['value']:>10} {r['unit']:<6} ratio {r['ratio']:>6}x  vs {r['reference']}")
    Path("build").mkdir(exist_ok=True)
    Path("build/bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
