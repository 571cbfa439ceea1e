"""The Python-visible align step against a per-copy loop and vectorised numpy (plan-step benchmark).

    .venv/bin/python benches/plan_step.py [--requests 256 --layers 48 --sweep 1 64 1024 --json]

The benchmark lives in the package (``recoverssm_rs.tools.bench.plan_step``: workload, methods and checks
are described there) and runs as ``python -m recoverssm_rs bench --only plan``; this script keeps
the old command working: one table (or JSON) for the request counts ``--requests`` and ``--sweep``.
"""

from __future__ import annotations

import argparse
import json
import sys

from recoverssm_rs.tools.bench import plan_step
from recoverssm_rs.tools.bench.progress import Progress
from recoverssm_rs.tools.bench.timing import Budget


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256, help="request count of the main case")
    ap.add_argument("--layers", type=int, default=48, help="GDN layers")
    ap.add_argument("--sweep", type=int, nargs="*", default=[1, 64, 1024], help="more request counts")
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timing per method and case")
    ap.add_argument("--repeat", type=int, help="ignored (timing follows --budget now)")
    ap.add_argument("--loop-repeat", type=int, help="ignored (timing follows --budget now)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    requests = sorted({args.requests, *args.sweep})
    if min(requests) < 1 or args.layers < 1 or args.budget <= 0:
        ap.error("request counts and --layers must be >= 1, --budget > 0")
    doc = plan_step.run(requests, args.layers, Budget(args.budget), Progress(plan_step.count_units(requests)))
    print(json.dumps(doc, indent=2) if args.json else plan_step.format_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
