#!/usr/bin/env python3
"""Checks every replay command `goodput profile export` prints against the real tool's own
argument parser (docs/PROFILE.md, "Replay commands").

  1. records a small profile: `goodput sim` behind `goodput serve` with `[profile] dir`,
     a few chat requests, the proxy stopped (files closed);
  2. asks `goodput profile export --commands` for the command lines of every format;
  3. parses each line (shell words, as a shell would split it) with the tool's own parser,
     without running it:
       - AIPerf: its cyclopts app (`aiperf.cli.app`), `parse_args` binds the `profile`
         command's parameters (types and choices checked) without calling it;
       - GuideLLM: its click group (`guidellm.__main__.cli`), `make_context` for `run`,
         which converts and validates every option without invoking the command;
       - vLLM: `vllm bench serve`'s argparse parser as the `vllm` CLI builds it
         (`vllm.benchmarks.serve.add_cli_args`), when the `vllm` package can be imported;
         otherwise the check says so and does not count as passed for vLLM.

Usage: scripts/replay-hints-check.py [--goodput BIN] [--python VENV_PYTHON]
The tools come from PyPI into a venv (target/hints-venv by default):
    python3 -m venv target/hints-venv
    target/hints-venv/bin/pip install aiperf==0.13.0 guidellm==0.8.1
Exit 0 when every printed command parses with every available tool; 1 otherwise.
"""
import argparse, json, os, shlex, subprocess, sys, tempfile, time, urllib.request

from ports import free_ports, wait_port

# Runs inside the tools' venv: parses one command line given as JSON words on stdin.
PARSE = r'''
import json, sys
words = json.load(sys.stdin)
tool = words[0]
if tool == "aiperf":
    from aiperf.cli import app
    command, bound, ignored = app.parse_args(words[1:], exit_on_error=False, print_error=True)
    print(f"aiperf {words[1]}: bound {sorted(bound.arguments)}")
elif tool == "guidellm":
    from guidellm.__main__ import cli
    ctx = cli.make_context("guidellm", words[1:], resilient_parsing=False)
    name, cmd, rest = cli.resolve_command(ctx, ctx.protected_args + ctx.args)
    sub = cmd.make_context(name, rest, parent=ctx)
    print(f"guidellm {name}: {sorted(k for k, v in sub.params.items() if v is not None)}")
elif tool == "vllm":
    import argparse
    from vllm.benchmarks.serve import add_cli_args
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    assert words[1:3] == ["bench", "serve"], words[:3]
    parser = FlexibleArgumentParser(prog="vllm bench serve", exit_on_error=False)
    add_cli_args(parser)
    ns = parser.parse_args(words[3:])
    print(f"vllm bench serve: dataset {ns.dataset_name}, backend {ns.backend}")
else:
    raise SystemExit(f"unknown tool {tool}")
'''

VERSIONS = r'''
import importlib.metadata as m
for p in ("aiperf", "guidellm", "vllm"):
    try:
        print(p, m.version(p))
    except m.PackageNotFoundError:
        print(p, "-")
'''


def record_profile(goodput, work):
    sim_port, proxy_port, admin_port = free_ports(3)
    cfg = os.path.join(work, "goodput.toml")
    with open(cfg, "w") as f:
        f.write(f'[profile]\ndir = "{work}/profiles"\n')
    sim = subprocess.Popen([goodput, "sim", "--listen", f"127.0.0.1:{sim_port}",
                            "--ttft", "fixed:1", "--itl", "fixed:1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    serve = subprocess.Popen([goodput, "serve", "--config", cfg,
                              "--listen", f"127.0.0.1:{proxy_port}",
                              "--admin", f"127.0.0.1:{admin_port}",
                              "--upstream", f"http://127.0.0.1:{sim_port}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(sim_port, sim)
        wait_port(proxy_port, serve)
        for i in range(5):
            body = {"model": "m", "stream": True, "max_tokens": 8,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": f"hello {i} " * 50}]}
            req = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                                         data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            urllib.request.urlopen(req, timeout=30).read()
        time.sleep(0.5)
    finally:
        serve.terminate()
        serve.wait(timeout=30)
        sim.terminate()
        sim.wait(timeout=10)
    files = [os.path.join(work, "profiles", n) for n in sorted(os.listdir(f"{work}/profiles"))]
    if not files:
        raise SystemExit("no profile file was written")
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--goodput", default="target/debug/goodput")
    ap.add_argument("--python", default="target/hints-venv/bin/python")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="replay-hints-")
    profiles = record_profile(a.goodput, work)
    print(subprocess.run([a.python, "-c", VERSIONS], capture_output=True, text=True,
                         check=True).stdout.strip())
    failed, unchecked = 0, 0
    for fmt, out in [("mooncake", "trace.jsonl"), ("burstgpt-csv", "trace.csv"),
                     ("azure-csv", "trace.csv")]:
        export = [a.goodput, "profile", "export", "--format", fmt, "-o",
                  os.path.join(work, out), "--url", "http://127.0.0.1:8000",
                  "--tokenizer", "gpt2", *profiles]
        # The file first: the tools check that the file they are given exists.
        subprocess.run(export, capture_output=True, check=True)
        lines = subprocess.run(export + ["--commands"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        for line in lines:
            words = shlex.split(line)
            got = subprocess.run([a.python, "-c", PARSE], input=json.dumps(words),
                                 capture_output=True, text=True)
            if got.returncode == 0:
                print(f"ok      {fmt}: {got.stdout.strip()}")
            elif words[0] == "vllm" and "No module named 'vllm" in got.stderr:
                unchecked += 1
                print(f"UNCHECKED {fmt}: vllm is not installed in the venv: {line}")
            else:
                failed += 1
                print(f"FAILED  {fmt}: {line}\n{got.stdout}{got.stderr}")
    print(f"{failed} failed, {unchecked} not checked")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
