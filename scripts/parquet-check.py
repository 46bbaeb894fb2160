#!/usr/bin/env python3
"""The Parquet export read by DuckDB agrees with `goodput profile summarize`.

Generates two synthetic profiles of one fleet (two instances, one salt; the generator of
scripts/profile-scale.py) plus a few non-generation lines that `summarize` leaves out,
exports them with `goodput profile export --format parquet`, reads the file with DuckDB
(from PyPI) and compares with `goodput profile summarize --json`: rows, requests, start,
arrival peak, model/API/outcome mixes, stream share, SLO counts, prefix reuse, and the
count, P50, P90, P95, P99 and max of input and output tokens (nearest rank, DuckDB's
`quantile_disc`). Exits 1 on any disagreement, naming it.

    python3 -m pip install duckdb
    python3 scripts/parquet-check.py --goodput target/debug/goodput [--requests 20000]
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import duckdb

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATION = "api NOT IN ('unknown', 'embeddings', 'upgrade')"


def generator():
    spec = importlib.util.spec_from_file_location(
        "profile_scale", os.path.join(HERE, "profile-scale.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def add_non_generation(path, n):
    """Appends `n` embeddings requests (as older versions recorded them)."""
    with open(path, "a") as f:
        for i in range(n):
            f.write('{"t_ms":%d,"model":"embed","api":"embeddings","stream":false,'
                    '"input_tokens":%d,"output_tokens":null,"outcome":"ok","status":200,'
                    '"slo_class":"default","slo_met":true,"ttft_ms":null,"tpot_ms":null,'
                    '"e2e_ms":3.0}\n' % (1000 * i, 100000 + i))


def request_lines(paths):
    n = 0
    for p in paths:
        with open(p) as f:
            n += sum(1 for line in f if line.startswith('{"t_ms"'))
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--goodput", default="target/debug/goodput")
    ap.add_argument("--requests", type=int, default=20000, help="per instance")
    a = ap.parse_args()

    gen = generator()
    work = tempfile.mkdtemp(prefix="goodput-parquet-check-")
    try:
        files = [os.path.join(work, "gw1.jsonl"), os.path.join(work, "gw2.jsonl")]
        gen.write_profile(files[0], a.requests, 11, gen.START_MS)
        gen.write_profile(files[1], a.requests + 7, 12, gen.START_MS + 3)
        add_non_generation(files[1], 25)
        out = os.path.join(work, "fleet.parquet")
        subprocess.run([a.goodput, "profile", "export", "--format", "parquet",
                        "--out", out] + files, check=True)
        summary = json.loads(subprocess.run(
            [a.goodput, "profile", "summarize", "--json"] + files,
            check=True, capture_output=True, text=True).stdout)
        problems = compare(summary, out, request_lines(files))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if problems:
        for p in problems:
            print("MISMATCH " + p, file=sys.stderr)
        sys.exit(1)
    print("parquet-check: DuckDB %s agrees with `profile summarize` on %d requests"
          % (duckdb.__version__, summary["requests"]))


def compare(s, parquet, lines):
    db = duckdb.connect()
    db.execute("CREATE VIEW r AS SELECT * FROM read_parquet('%s')" % parquet.replace("'", "''"))
    db.execute("CREATE VIEW g AS SELECT * FROM r WHERE " + GENERATION)
    one = lambda sql: db.execute(sql).fetchone()[0]
    problems = []

    def check(what, want, got):
        same = (abs(want - got) <= 1e-9 * max(1.0, abs(want))
                if isinstance(want, float) or isinstance(got, float) else want == got)
        if not same:
            problems.append("%s: summarize %r, DuckDB %r" % (what, want, got))

    check("rows (every request line)", lines, one("SELECT count(*) FROM r"))
    check("requests", s["requests"], one("SELECT count(*) FROM g"))
    started = one("SELECT strftime(min(arrival), '%Y-%m-%dT%H:%M:%S.%g') || 'Z' FROM g")
    check("started_at", s["started_at"], started)
    check("arrival peak per second", s["arrival_rate"]["peak_per_s"], one(
        "SELECT max(n) FROM (SELECT count(*) n FROM g GROUP BY floor(epoch_ms(arrival) / 1000))"))
    for key, expr in [("models", "coalesce(model, 'unknown')"), ("apis", "api"),
                      ("outcomes", "outcome")]:
        got = dict(db.execute("SELECT %s, count(*) FROM g GROUP BY 1" % expr).fetchall())
        check(key, s[key], got)
    check("stream share", s["stream_share"], one("SELECT avg(stream::INT) FROM g"))
    check("SLO met", s["slo"]["met"], one("SELECT count(*) FROM g WHERE slo_met"))
    check("SLO missed", s["slo"]["missed"], one("SELECT count(*) FROM g WHERE NOT slo_met"))
    # A block is reused when its id was seen before (earlier request or earlier in the
    # same one): all blocks minus distinct blocks.
    total, distinct = db.execute(
        "SELECT count(*), count(DISTINCT id) FROM (SELECT unnest(hash_ids) id FROM g)").fetchone()
    check("prefix reuse", s["prefix_reuse"], (total - distinct) / total if total else None)
    for key, col in [("input_tokens", "input_tokens"), ("output_tokens", "output_tokens")]:
        d = s[key]
        row = db.execute(
            "SELECT count(%s), quantile_disc(%s, 0.5), quantile_disc(%s, 0.9), "
            "quantile_disc(%s, 0.95), quantile_disc(%s, 0.99), max(%s) FROM g"
            % ((col,) * 6)).fetchone()
        for name, got in zip(["count", "p50", "p90", "p95", "p99", "max"], row):
            want = d[name]
            check("%s %s" % (key, name), want, float(got) if name != "count" else got)
    return problems


if __name__ == "__main__":
    main()
