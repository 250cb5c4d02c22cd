// Prints llama.cpp's greedy continuation of each prompt as one JSON line:
// {"prompt": ..., "prompt_ids": [...], "ids": [...], "margins": [...]} where prompt_ids
// is llama.cpp's tokenization (with BOS where the vocabulary adds it), ids the tokens
// it picks, and margins how far each pick's logit is above the runner-up's: where a
// margin is within rounding, another faithful implementation may pick the other.
// Built and run by scripts/oracle/record-greedy.sh.
//
// usage: greedy MODEL.gguf N_TOKENS PROMPT [PROMPT ...]

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void print_json_string(const char * s) {
    putchar('"');
    for (const unsigned char * p = (const unsigned char *) s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p);
        } else if (*p == '\n') {
            printf("\\n");
        } else if (*p < 0x20) {
            printf("\\u%04x", *p);
        } else {
            putchar(*p);
        }
    }
    putchar('"');
}

static void print_ids(const llama_token * ids, int n) {
    putchar('[');
    for (int i = 0; i < n; i++) {
        printf("%s%d", i ? ", " : "", ids[i]);
    }
    putchar(']');
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf N_TOKENS PROMPT [PROMPT ...]\n", argv[0]);
        return 2;
    }
    int n_gen = atoi(argv[2]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    for (int a = 3; a < argc; a++) {
        const char * prompt = argv[a];
        llama_token ids[1024];
        int n = llama_tokenize(vocab, prompt, (int) strlen(prompt), ids, 1024, true, false);
        if (n < 0 || n + n_gen > 1024) {
            fprintf(stderr, "prompt too long\n");
            return 1;
        }
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 1024;
        struct llama_context * ctx = llama_init_from_model(model, cp);
        struct llama_sampler * greedy = llama_sampler_init_greedy();
        llama_token out[1024];
        float margins[1024];
        int n_out = 0;
        int n_vocab = llama_vocab_n_tokens(vocab);
        struct llama_batch batch = llama_batch_get_one(ids, n);
        while (n_out < n_gen) {
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
            llama_token t = llama_sampler_sample(greedy, ctx, -1);
            const float * logits = llama_get_logits_ith(ctx, -1);
            float second = -1e30f;
            for (int i = 0; i < n_vocab; i++) {
                if (i != t && logits[i] > second) {
                    second = logits[i];
                }
            }
            margins[n_out] = logits[t] - second;
            out[n_out++] = t;
            if (llama_vocab_is_eog(vocab, t)) {
                break;
            }
            batch = llama_batch_get_one(&out[n_out - 1], 1);
        }
        printf("{\"prompt\": ");
        print_json_string(prompt);
        printf(", \"prompt_ids\": ");
        print_ids(ids, n);
        printf(", \"ids\": ");
        print_ids(out, n_out);
        printf(", \"margins\": [");
        for (int i = 0; i < n_out; i++) {
            printf("%s%.4f", i ? ", " : "", margins[i]);
        }
        printf("]}\n");
        llama_sampler_free(greedy);
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
