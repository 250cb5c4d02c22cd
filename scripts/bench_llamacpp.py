#!/usr/bin/env python3
"""The anchor of `acs bench --llama-cpp`: llama.cpp (llama-cpp-python) on the same GGUF
with the same shapes: prefill of PROMPT tokens, greedy decode of DECODE tokens for one
sequence and for eight sequences in one batch. Prints one line of medians.

usage: bench_llamacpp.py MODEL PROMPT DECODE REPEAT THREADS
"""
import statistics
import sys
import time

import llama_cpp
import numpy as np

model, n_prompt, n_decode, repeat, threads = sys.argv[1], *map(int, sys.argv[2:6])
llama_cpp.llama_backend_init()
mparams = llama_cpp.llama_model_default_params()
lm = llama_cpp.llama_model_load_from_file(model.encode(), mparams)
vocab = llama_cpp.llama_model_get_vocab(lm)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
text = b"The sky is blue because molecules in the air scatter blue light from the sun more than they scatter red light. "
buf = (llama_cpp.llama_token * 512)()
n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, 512, False, False)
ids = [buf[i % n] for i in range(n_prompt)]


def context():
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = 1024
    cp.n_batch = 1024
    cp.n_ubatch = 512
    cp.n_seq_max = 8
    cp.n_threads = threads
    cp.n_threads_batch = threads
    return llama_cpp.llama_init_from_model(lm, cp)


def argmax(ctx, i):
    row = llama_cpp.llama_get_logits_ith(ctx, i)
    return int(np.ctypeslib.as_array(row, shape=(n_vocab,)).argmax())


def run_batch(ctx, tokens_per_seq, want_logits):
    """tokens_per_seq: list of (seq, pos, token)."""
    b = llama_cpp.llama_batch_init(len(tokens_per_seq), 0, 8)
    for i, (seq, pos, tok) in enumerate(tokens_per_seq):
        b.token[i] = tok
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = want_logits(i)
    b.n_tokens = len(tokens_per_seq)
    assert llama_cpp.llama_decode(ctx, b) == 0
    llama_cpp.llama_batch_free(b)


pre, d1, d8 = [], [], []
for _ in range(repeat):
    for n_seq, out in ((1, d1), (8, d8)):
        ctx = context()
        t = time.perf_counter()
        run_batch(ctx, [(0, p, tok) for p, tok in enumerate(ids)], lambda i: i == len(ids) - 1)
        if n_seq == 1:
            pre.append(len(ids) / (time.perf_counter() - t))
        first = argmax(ctx, len(ids) - 1)
        mem = llama_cpp.llama_get_memory(ctx)
        for s in range(1, n_seq):
            llama_cpp.llama_memory_seq_cp(mem, 0, s, -1, -1)
        feed = [first] * n_seq
        t = time.perf_counter()
        for step in range(n_decode):
            run_batch(ctx, [(s, len(ids) + step, feed[s]) for s in range(n_seq)], lambda i: True)
            feed = [argmax(ctx, s) for s in range(n_seq)]
        out.append(n_decode * n_seq / (time.perf_counter() - t))
        llama_cpp.llama_free(ctx)

print(
    f"llama.cpp prefill {statistics.median(pre):8.1f} tok/s | decode x1 {statistics.median(d1):7.1f} tok/s"
    f" | decode x8 {statistics.median(d8):7.1f} tok/s"
)
