#!/usr/bin/python3
"""Compares two builds of sneppx-bench run in alternated processes.

    bench/ab_compare.py --stage STAGE --impl IMPL A_NAME A1.csv,A2.csv,... B_NAME B1.csv,B2.csv,...

Round i pairs A's i-th CSV with B's i-th (sneppx-bench --csv, the same stages, one
process each, run A, B, B, A, A, B, ... so that the host's drift falls on both: with A
always first, a host that sped up through the runs favoured B by as much as 2-8%, which
the OpenBLAS rows, the same in both builds, showed). For each
row of STAGE and IMPL (case, T, threads) it prints both sides' median times over the
rounds and B's speedup over A per round (A's time / B's time): median [min-max]. A
ratio within a round is what the shared host lets one trust; the medians alone wander
with its memory and the other vCPU's load.
"""
import argparse
import csv
import statistics
import sys


def read_rows(path, stage, impl):
    """{(case, tokens, threads): median_ms} of one run's CSV."""
    with open(path, newline="") as f:
        return {(r["case"], int(r["tokens"]), int(r["threads"])): float(r["median_ms"])
                for r in csv.DictReader(f) if r["stage"] == stage and r["impl"] == impl}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", required=True, help="the CSV's stage column, e.g. attention")
    parser.add_argument("--impl", required=True, help="the CSV's impl column, e.g. flash")
    parser.add_argument("a_name")
    parser.add_argument("a_csvs", help="comma-separated, one per round")
    parser.add_argument("b_name")
    parser.add_argument("b_csvs", help="comma-separated, one per round")
    args = parser.parse_args()
    a_paths, b_paths = args.a_csvs.split(","), args.b_csvs.split(",")
    if len(a_paths) != len(b_paths):
        sys.exit(f"ab_compare: {len(a_paths)} CSVs for {args.a_name} but {len(b_paths)} for {args.b_name}: "
                 "a round is one of each")
    rounds = [(read_rows(a, args.stage, args.impl), read_rows(b, args.stage, args.impl))
              for a, b in zip(a_paths, b_paths)]
    keys = sorted(set.intersection(*(set(a) & set(b) for a, b in rounds)), key=lambda k: (k[0], k[2], k[1]))
    if not keys:
        sys.exit(f"ab_compare: no '{args.stage}' rows of '{args.impl}' in every CSV")
    print(f"{args.stage} {args.impl}: {args.b_name} against {args.a_name}, {len(rounds)} alternated rounds; "
          f"speedup = {args.a_name}'s time / {args.b_name}'s in a round, median [min-max]")
    print(f"  {'case':<24} {'T':>6} {'thr':>3} {args.a_name + ' ms':>14} {args.b_name + ' ms':>14}  speedup")
    for key in keys:
        a_ms = [a[key] for a, _ in rounds]
        b_ms = [b[key] for _, b in rounds]
        ratios = [x / y for x, y in zip(a_ms, b_ms)]
        print(f"  {key[0]:<24} {key[1]:>6} {key[2]:>3} {statistics.median(a_ms):>14.2f} "
              f"{statistics.median(b_ms):>14.2f}  {statistics.median(ratios):.3f}x "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
