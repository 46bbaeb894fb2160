#!/usr/bin/env python3
"""Check deploy/grafana/goodput-dashboard.json (called by deploy/prometheus/check.sh).

- the file is valid JSON and importable in shape: schemaVersion, a DS_PROMETHEUS entry in
  __inputs, the template variables `class` and `window`, every panel on ${DS_PROMETHEUS};
- every PromQL expression references only metrics goodput exposes or series recorded by
  deploy/prometheus/goodput-rules.yml, for every value of the `window` variable;
- with --promtool PATH: every expression (variables substituted) parses, by running
  `promtool check rules` on a scratch rules file made of them.

Silent on success; prints the problems and exits 1 otherwise. Standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# What goodput exposes (PromQL names; histograms also as _bucket/_sum/_count).
COUNTERS = {
    "goodput_requests_total",
    "goodput_output_tokens_total",
    "goodput_measurement_dropped_total",
    "goodput_decode_failures_total",
    "goodput_config_reload_failures_total",
    "goodput_passthrough_requests_total",
    "goodput_slo_misses_total",
    "goodput_finish_reasons_total",
}
GAUGES = {
    "goodput_slo_attainment_ratio",
    "goodput_effective_output_tokens_per_second",
    "goodput_raw_output_tokens_per_second",
    "goodput_max_stable_concurrency",
    "goodput_knee_concurrency",
    "goodput_cost_per_million_effective_tokens",
    "goodput_slo_attainment_target_ratio",
    "goodput_cost_per_hour",
    "goodput_in_flight_requests",
}
HISTOGRAMS = {
    "gen_ai_server_time_to_first_token_seconds",
    "gen_ai_server_time_per_output_token_seconds",
    "gen_ai_server_request_duration_seconds",
    "goodput_inter_token_latency_seconds",
    "gen_ai_client_token_usage",
}
EXPOSED = COUNTERS | GAUGES | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "atan2", "inf", "nan"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def recorded_names(rules_path):
    with open(rules_path, encoding="utf-8") as f:
        return set(re.findall(r"^\s*-\s*record:\s*(\S+)\s*$", f.read(), re.M))


def metric_names(expr):
    """Metric names an expression selects (a small PromQL scanner, enough for dashboards)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)     # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                 # range / subquery durations
    e = GROUPING.sub(" ", e)                         # by (...), on (...), ...
    names = set()
    for m in IDENT.finditer(e):
        word = m.group(0)
        start, end = m.span()
        if start > 0 and (e[start - 1].isdigit() or e[start - 1] == "."):
            continue                                  # part of a number such as 1e6
        if re.match(r"\s*\(", e[end:]):
            continue                                  # a function call
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def substitute(expr, window):
    e = expr.replace("${window}", window).replace("$window", window)
    e = e.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    e = re.sub(r"\$\{?(job|class)\}?", ".*", e)
    return e


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dashboard")
    ap.add_argument("rules")
    ap.add_argument("--promtool", help="promtool binary: also check that every expression parses")
    args = ap.parse_args()

    problems = []
    try:
        with open(args.dashboard, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as err:
        print(f"{args.dashboard}: not valid JSON: {err}", file=sys.stderr)
        return 1

    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        problems.append("schemaVersion missing or older than 36")
    if not any(i.get("name") == "DS_PROMETHEUS" and i.get("pluginId") == "prometheus"
               for i in dash.get("__inputs", [])):
        problems.append("__inputs has no DS_PROMETHEUS prometheus datasource entry")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    for name in ("class", "window"):
        if name not in variables:
            problems.append(f"template variable `{name}` missing")
    windows = [o["value"] for o in variables.get("window", {}).get("options", [])] or ["5m"]

    recorded = recorded_names(args.rules)
    allowed = EXPOSED | recorded
    exprs = []
    ids = set()
    for p in walk_panels(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        title = p.get("title", "?")
        if p.get("id") in ids:
            problems.append(f"panel {title!r}: duplicate id {p.get('id')}")
        ids.add(p.get("id"))
        if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
            problems.append(f"panel {title!r}: datasource is not ${{DS_PROMETHEUS}}")
        for t in p.get("targets", []):
            expr = t.get("expr", "")
            if not expr.strip():
                problems.append(f"panel {title!r} target {t.get('refId')}: empty expr")
                continue
            if t.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                problems.append(f"panel {title!r} target {t.get('refId')}: datasource is not ${{DS_PROMETHEUS}}")
            for w in windows:
                concrete = substitute(expr, w)
                if "$" in concrete:
                    problems.append(f"panel {title!r}: unknown variable in {expr!r}")
                    continue
                exprs.append((title, concrete))
                for name in sorted(metric_names(concrete) - allowed):
                    problems.append(f"panel {title!r} (window {w}): {name} is neither a goodput "
                                    f"metric nor recorded by {os.path.basename(args.rules)}")
    if not exprs:
        problems.append("no PromQL expression found")

    if args.promtool and exprs:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "dashboard-exprs.yml")
            with open(path, "w", encoding="utf-8") as f:
                f.write("groups:\n  - name: dashboard\n    rules:\n")
                for i, (title, e) in enumerate(exprs):
                    f.write(f"      # {title}\n      - record: dashboard:expr_{i}:check\n")
                    f.write(f"        expr: {json.dumps(e)}\n")
            res = subprocess.run([args.promtool, "check", "rules", path],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                problems.append("an expression does not parse:\n" + res.stdout + res.stderr)

    if problems:
        for p in problems:
            print(f"{args.dashboard}: {p}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
