#!/usr/bin/env python3
"""How decode speed grows with context and with concurrent sequences, acs beside llama.cpp.

For each GGUF file, two sweeps, each side one after the other so that they never
share the cores:
- context: a prompt of D tokens (D in --contexts), then 32 greedy tokens for 1 and
  for 8 sequences that share that prompt: `acs bench --forward-only --prompt-tokens D
  --batch 8` against `llama-batched-bench -npp D -ntg 32 -npl 1,8 -pps`;
- concurrency: a 128-token prompt, then B sequences decoding together (B in
  --batches): `acs bench --forward-only --batch B` against `llama-batched-bench
  -npp 128 -ntg 32 -npl 1,8,32,128 -pps -kvu` (one KV buffer for all sequences).
Each figure is generated tokens/s over all sequences (llama-batched-bench's S_TG);
acs's are medians of 3 runs below a 4k prompt and single runs above, as
llama-batched-bench's are.
Prints one Markdown table per sweep and file: acs / llama.cpp (ratio).

usage: LLAMA_BIN=DIR scripts/bench_scaling.py [--acs ACS] [--threads T]
           [--contexts 128,1024,4096,16384] [--batches 1,8,32,128] FILE.gguf...
"""

import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_llamacpp_tools import failed, run  # noqa: E402

DECODE = 32


def acs(args, path, prompt, batch):
    """acs's decode x1 and xB tokens/s after a prompt of `prompt` tokens."""
    # Medians of three runs, but one where the prompt's prefill dominates the time.
    repeat = 3 if prompt < 4096 else 1
    text = run([args.acs, "bench", "--forward-only", "--model", path, "--repeat", str(repeat),
                "--prompt-tokens", str(prompt), "--decode-tokens", str(DECODE),
                "--batch", str(batch)])
    m = re.search(r"decode x1\s+([\d.]+) tok/s \| decode x\d+\s+([\d.]+)", text)
    if not m:
        sys.exit(f"unexpected acs bench output:\n{text}")
    return float(m.group(1)), float(m.group(2))


def llama_cpp(args, path, prompt, batches):
    """llama.cpp's S_TG for each of `batches` sequences after a shared prompt, and
    whether it took `--swa-full` to run."""
    batched = os.path.join(args.bin, "llama-batched-bench")
    ctx = prompt + max(batches) * DECODE + 64
    cmd = [batched, "-m", path, "-c", str(ctx), "-npp", str(prompt), "-ntg", str(DECODE),
           "-npl", ",".join(map(str, batches)), "-pps", "-kvu", "-t", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    swa_full = out.returncode != 0 and "failed to find a memory slot" in out.stderr
    if swa_full:
        # A model with sliding-window layers (Gemma 3) keeps only its windows'
        # positions there, too few for several sequences sharing a long prompt;
        # `--swa-full` keeps them all. It slows llama.cpp's prefill, not its decode.
        text = run(cmd + ["--swa-full"])
    elif out.returncode != 0:
        failed(cmd, out)
    else:
        text = out.stdout
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    rates = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 8 and cells[3].isdigit():
            rates[int(cells[3])] = float(cells[8])
    return [rates[b] for b in batches], swa_full


def cell(a, b):
    return f"{a:.1f} / {b:.1f} ({a / b:.2f}x)"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+")
    p.add_argument("--acs", default="acs")
    p.add_argument("--bin", default=os.environ.get("LLAMA_BIN", ""))
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--contexts", default="128,1024,4096,16384")
    p.add_argument("--batches", default="1,8,32,128")
    args = p.parse_args()
    if not args.bin:
        sys.exit("set LLAMA_BIN (or --bin) to the directory of llama-batched-bench")
    contexts = [int(v) for v in args.contexts.split(",") if v]
    batches = [int(v) for v in args.batches.split(",") if v]
    print(f"threads {args.threads}, {DECODE} tokens decoded per sequence; "
          "generated tok/s over all sequences, acs / llama.cpp (ratio)")
    for path in args.files:
        name = os.path.basename(path)
        if contexts:
            print(f"\n{name}: context\n\n| context | decode x1 | decode x8 |\n|---|---|---|")
            for d in contexts:
                a = acs(args, path, d, 8)
                ll, full = llama_cpp(args, path, d, [1, 8])
                mark = " (llama.cpp with `--swa-full`)" if full else ""
                print(f"| {d}{mark} | {cell(a[0], ll[0])} | {cell(a[1], ll[1])} |", flush=True)
        if batches:
            print(f"\n{name}: sequences (128-token prompt)\n\n| sequences | decode |\n|---|---|")
            ll, full = llama_cpp(args, path, 128, batches)
            mark = " (llama.cpp with `--swa-full`)" if full else ""
            for b, lb in zip(batches, ll):
                a = acs(args, path, 128, b)
                print(f"| {b}{mark} | {cell(a[0] if b == 1 else a[1], lb)} |", flush=True)


if __name__ == "__main__":
    main()
