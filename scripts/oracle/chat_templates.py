#!/usr/bin/env python3
"""Renders the chat templates in crates/acs-llama/tests/fixtures/chat_templates/ as
`transformers`' `apply_chat_template` renders them, into rendered.json there: the oracle
that tests/chat_templates.rs holds ACS's minijinja rendering to.

The environment is transformers' own: jinja2's ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls; `raise_exception`, `strftime_now` and
`tojson` (json.dumps with ensure_ascii=False) defined. Needs only `jinja2`.

Usage: scripts/oracle/chat_templates.py
"""
import datetime
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "acs-llama",
                    "tests", "fixtures", "chat_templates")

# The time strftime_now formats (Unix seconds), the same in the Rust test.
NOW = 1_796_416_011

# bos_token and eos_token as each model's tokenizer names them.
SPECIALS = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "gemma-3": ("<bos>", "<eos>"),
    "llama-3.2": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": ("", "<|im_end|>"),
    "mistral-nemo": ("<s>", "</s>"),
    "phi-3.5": ("<s>", "<|endoftext|>"),
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "  Name a colour.  "},
    ],
    "turns": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Say \"quote\" and 'apostrophe', then ünïcödé ✓\nand a new line."},
    ],
    "assistant_first": [
        {"role": "assistant", "content": "I speak first."},
        {"role": "user", "content": "Fine."},
    ],
    "two_users": [
        {"role": "user", "content": "One."},
        {"role": "user", "content": "Two."},
    ],
}


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = environment()
    out = {"now": NOW, "templates": {}}
    for name, (bos, eos) in sorted(SPECIALS.items()):
        with open(os.path.join(HERE, f"{name}.jinja"), encoding="utf-8") as f:
            template = env.from_string(f.read())
        cases = {}
        for conv, messages in CONVERSATIONS.items():
            for gen in (True, False):
                key = f"{conv}/{'generation' if gen else 'no_generation'}"
                try:
                    cases[key] = {"text": template.render(messages=messages, add_generation_prompt=gen,
                                                          bos_token=bos, eos_token=eos)}
                except jinja2.exceptions.TemplateError as e:
                    cases[key] = {"error": str(e)}
        out["templates"][name] = {"bos_token": bos, "eos_token": eos, "cases": cases}
    out["conversations"] = CONVERSATIONS
    with open(os.path.join(HERE, "rendered.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(out, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
