"""Coverage of the pack's own support matrix: which of its PASS rows infercast answers.

``python -m benchmarks.support_matrix [--all] [--system S] [--backend B] [--jobs N] [--ray [ADDRESS]] [--json] [--quiet]``

Reads ``systems/support_matrix/*.csv`` of the pack (:mod:`infercast.data.support_matrix`) and
probes one representative configuration per PASS row in this one process
(:mod:`infercast.search.support`: the smallest layout within the row's ``--total-gpus`` that holds
the model and one request of 256 + 256 tokens, 8 clients, agg or disagg as the row says). Prints
coverage by model family (architecture), system, backend and version, and the PASS rows missed
grouped by reason. ``--all`` also probes the non-PASS rows and shows a sample of those infercast
answers, for a check of their sense.

Work is shared: a (model, system, backend, version) is probed once for both modes, rows are
visited grouped by (system, backend, version) so each table is read once, and each model's spec is
built once; ``--jobs N`` spreads the (system, backend) groups over N processes, ``--ray [ADDRESS]``
runs them as Ray tasks (:mod:`infercast.search.executor`; same answers either way).
Progress goes to stderr (rich); ``--json`` prints only the numbers on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from infercast.data.pack import find_pack
from infercast.data.support_matrix import read_matrix
from infercast.report.support import print_agreement, progress_bar
from infercast.search.support import Probe, Prober, compare

BY = ("architecture", "system", "backend", "version")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all", action="store_true", help="also probe the matrix's non-PASS rows")
    ap.add_argument("--system", help="only this system's rows")
    ap.add_argument("--backend", help="only this backend's rows")
    ap.add_argument("--systems-path", help="the pack's systems/ directory (default: the installed pack)")
    ap.add_argument("--jobs", type=int, default=None, help="processes to spread the (system, backend) groups over")
    ap.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="run the groups as Ray tasks: local, auto, HOST:PORT or ray://HOST:PORT (as infercast support)")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON on stdout")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    pack = find_pack(a.systems_path)
    matrix = [m for m in read_matrix(pack)
              if (a.system is None or m.system == a.system) and (a.backend is None or m.backend == a.backend)]
    if not matrix:
        print(f"no support-matrix rows in {pack.systems_dir} for the filters", file=sys.stderr)
        return 2
    prober = Prober(Probe(), systems_path=a.systems_path)
    t0 = time.perf_counter()
    with progress_bar("support matrix", enabled=not a.quiet) as progress:
        agreement = compare(prober, matrix, statuses=None if a.all else ("PASS",), jobs=a.jobs, ray=a.ray,
                            progress=progress)
    wall = time.perf_counter() - t0
    combos = prober.probed
    if a.json:
        out = {**agreement.summary(), "wall_s": round(wall, 1), "combinations_probed": combos,
               **{f"by_{k}": {v: list(n) for v, n in agreement.coverage_by(k).items()} for k in BY}}
        print(json.dumps(out, indent=1))
        return 0
    print_agreement(agreement, by=BY)
    print(f"{len(agreement.pairs)} rows, {combos} (model, system, backend, version) combinations probed "
          f"in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
