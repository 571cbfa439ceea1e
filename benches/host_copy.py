"""Host executor bandwidth against torch on the same bytes (host-copy benchmark).

    .venv/bin/python benches/host_copy.py [--sizes 4K 64K 256K 2M] [--batches 64 256] [--json]

The benchmark lives in the package (``recoverssm_rs.tools.bench.host_copy``: workload and methods are
described there) and runs as ``python -m recoverssm_rs bench --only host``; this script keeps the
old command working.
"""

from __future__ import annotations

import argparse
import json
import sys

from recoverssm_rs.tools.bench import host_copy
from recoverssm_rs.tools.bench.progress import Progress
from recoverssm_rs.tools.bench.timing import Budget


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", nargs="*", default=list(host_copy.SHAPES), choices=list(host_copy.SHAPES))
    ap.add_argument("--batches", nargs="*", type=int, default=[64, 256])
    ap.add_argument("--budget", type=float, default=0.4, help="seconds of timing per method and case")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args(argv)
    if not args.sizes or not args.batches or min(args.batches) < 1 or args.budget <= 0:
        ap.error("give at least one size and batch; batches must be >= 1, --budget > 0")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    progress = Progress(host_copy.count_units(args.sizes, args.batches))
    doc = host_copy.run(args.sizes, args.batches, Budget(args.budget), progress)
    print(json.dumps(doc, indent=2) if args.json else host_copy.format_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
