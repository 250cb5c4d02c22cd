"""Writes crates/acs-server/openapi.json (OpenAPI 3.1) — the ACS contract as a schema.

Run: python tests/conformance/gen_openapi.py  (edit here, not in the JSON).
The document follows ../../shared/API.md and the limits of crates/acs-core/src/request.rs.
"""

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "crates" / "acs-server" / "openapi.json"


def ref(name, kind="schemas"):
    return {"$ref": f"#/components/{kind}/{name}"}


INT = {"type": "integer"}
U32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}
TIME = {"type": "string", "format": "date-time",
        "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}\+00:00$",
        "description": "RFC 3339 with milliseconds and +00:00."}
NTIME = {"oneOf": [TIME, {"type": "null"}]}
TOKEN_IDS = {"type": "array", "minItems": 1, "items": U32}

steering_entry = {
    "type": "object",
    "additionalProperties": False,
    "required": ["layer"],
    "description": "Adds scale × vector to the residual stream output of block `layer` at every "
                   "position. Give exactly one of `vector`, `vector_b64`, or `positive` with `negative`.",
    "properties": {
        "layer": {"type": "integer", "minimum": 0, "maximum": 4294967295,
                  "description": "Below the model's n_layers."},
        "scale": {"type": "number", "minimum": -1000, "maximum": 1000, "default": 1},
        "vector": {"type": "array", "minItems": 1, "maxItems": 65536, "items": {"type": "number"},
                   "description": "d_model finite numbers."},
        "vector_b64": {"type": "string", "contentEncoding": "base64",
                       "description": "Base64 of d_model little-endian f32 values."},
        "positive": {"type": "string", "minLength": 1},
        "negative": {"type": "string", "minLength": 1},
    },
}

request_props = {
    "model": {"type": "string", "minLength": 1, "maxLength": 256,
              "description": "A model id of GET /v1/models (e.g. llama-8b)."},
    "prompt": {
        "description": "A string, an array of strings, an array of token ids, or an array of arrays "
                       "of token ids (at most 256 prompts).",
        "oneOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "maxItems": 256, "items": {"type": "string"}},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "maxItems": 256, "items": TOKEN_IDS},
        ],
    },
    "max_tokens": dict(U32, default=16,
                       description="Per choice; prompt + max_tokens must fit the context window."),
    "n": {"type": "integer", "minimum": 1, "maximum": 128, "default": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "default": 1},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1},
    "top_k": dict(U32, default=0, description="0 keeps all tokens."),
    "seed": {"type": "integer", "minimum": -9223372036854775808, "maximum": 18446744073709551615},
    "stop": {"oneOf": [{"type": "string", "minLength": 1, "maxLength": 256},
                       {"type": "array", "maxItems": 4,
                        "items": {"type": "string", "minLength": 1, "maxLength": 256}},
                       {"type": "null"}]},
    "echo": {"type": "boolean", "default": False},
    "logprobs": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 5}, {"type": "null"}]},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "default": 0},
    "logit_bias": {"oneOf": [{"type": "object", "maxProperties": 1024,
                              "propertyNames": {"pattern": "^[0-9]{1,10}$"},
                              "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
                             {"type": "null"}]},
    "stream": {"type": "boolean", "default": False},
    "stream_options": {"oneOf": [{"type": "object", "additionalProperties": False,
                                  "properties": {"include_usage": {"type": "boolean"}}},
                                 {"type": "null"}]},
    "user": {"type": "string", "maxLength": 256},
    "steering": {"type": "array", "maxItems": 16, "items": ref("SteeringEntry")},
}

activations_req = {
    "type": "object", "additionalProperties": False, "required": ["layers"],
    "properties": {
        "layers": {"type": "array", "minItems": 1, "maxItems": 64,
                   "items": {"type": "integer", "minimum": 0, "maximum": 4294967295}},
        "positions": {"type": "string", "enum": ["last", "all"], "default": "last"},
    },
}

completion_request = {
    "type": "object", "additionalProperties": False, "required": ["model", "prompt"],
    "description": "Unknown fields are refused (400 unknown_parameter, param = the field).",
    "properties": dict(request_props, activations=ref("ActivationsRequest")),
}
job_request = {
    "type": "object", "additionalProperties": False, "required": ["model", "prompt"],
    "description": "A completions request without streaming, plus `activations`.",
    "properties": dict({k: v for k, v in request_props.items() if k not in ("stream", "stream_options")},
                       stream={"type": "boolean", "enum": [False]},
                       stream_options={"type": "null"},
                       activations=ref("ActivationsRequest")),
}

text_part = {
    "type": "object", "additionalProperties": False, "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
}
chat_message = {
    "type": "object", "additionalProperties": False, "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["system", "user", "assistant"]},
        "content": {"oneOf": [{"type": "string"},
                              {"type": "array", "items": ref("TextPart"),
                               "description": "Text parts, joined with newlines."}]},
        "name": {"type": "string", "maxLength": 256},
    },
}
chat_props = {
    "model": request_props["model"],
    "messages": {"type": "array", "minItems": 1, "maxItems": 4096, "items": ref("ChatMessage"),
                 "description": "One conversation, rendered by the model's own chat template "
                                "(tokenizer.chat_template) with the generation prompt."},
    "max_completion_tokens": dict(U32, description="Per choice. Without it (or max_tokens), "
                                  "at most 4096 or what the context window leaves, and the "
                                  "Hold covers that."),
    "max_tokens": dict(U32, description="The older name of max_completion_tokens."),
    **{k: request_props[k] for k in ("n", "temperature", "top_p", "seed", "stop",
                                      "presence_penalty", "frequency_penalty", "logit_bias",
                                      "stream", "stream_options", "user", "steering")},
    "logprobs": {"oneOf": [{"type": "boolean"}, {"type": "null"}], "default": False},
    "top_logprobs": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 20}, {"type": "null"}],
                     "description": "Needs logprobs: true."},
}
chat_request = {
    "type": "object", "additionalProperties": False, "required": ["model", "messages"],
    "description": "OpenAI's Chat Completions request; unknown fields are refused.",
    "properties": dict(chat_props, activations=ref("ActivationsRequest")),
}
chat_job_request = {
    "type": "object", "additionalProperties": False, "required": ["model", "messages"],
    "description": "A chat request without streaming, plus `activations`.",
    "properties": dict({k: v for k, v in chat_props.items() if k not in ("stream", "stream_options")},
                       stream={"type": "boolean", "enum": [False]},
                       stream_options={"type": "null"},
                       activations=ref("ActivationsRequest")),
}

logprobs = {
    "type": "object",
    "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
    "properties": {
        "tokens": {"type": "array", "items": {"type": "string"}},
        "token_logprobs": {"type": "array", "items": {"type": ["number", "null"]}},
        "top_logprobs": {"type": "array", "items": {"oneOf": [
            {"type": "object", "additionalProperties": {"type": "number"}}, {"type": "null"}]}},
        "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    },
}
choice = {
    "type": "object", "additionalProperties": False,
    "required": ["index", "text", "finish_reason", "logprobs"],
    "properties": {
        "index": {"type": "integer", "minimum": 0, "description": "prompt * n + choice."},
        "text": {"type": "string"},
        "finish_reason": {"enum": ["stop", "length", None]},
        "logprobs": {"oneOf": [ref("Logprobs"), {"type": "null"}]},
    },
}
usage = {
    "type": "object", "additionalProperties": False,
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0,
                          "description": "Each prompt counted once, whatever n is."},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {
            "type": "object", "additionalProperties": False,
            "required": ["cached_tokens"],
            "properties": {
                "cached_tokens": {
                    "type": "integer", "minimum": 0,
                    "description": "Prompt tokens the engine took from its prompt cache (a "
                                   "prompt prefilled earlier, identical or sharing their "
                                   "beginning) instead of prefilling them; still counted in "
                                   "prompt_tokens and charged."},
            },
        },
    },
}
activation = {
    "type": "object", "additionalProperties": False,
    "required": ["prompt_index", "layer", "positions", "shape", "dtype", "data"],
    "properties": {
        "prompt_index": {"type": "integer", "minimum": 0},
        "layer": {"type": "integer", "minimum": 0},
        "positions": {"enum": ["last", "all"]},
        "shape": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer", "minimum": 0}},
        "dtype": {"const": "f32"},
        "data": {"type": "string", "contentEncoding": "base64",
                 "description": "Little-endian f32, row-major [positions, d_model]."},
    },
}
completion = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string", "pattern": "^cmpl-"},
        "object": {"const": "text_completion"},
        "created": {"type": "integer", "description": "Unix seconds."},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": ref("Choice"), "description": "Sorted by index."},
        "usage": ref("Usage"),
        "activations": {"type": "array", "items": ref("Activation")},
    },
}
chunk = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "object", "created", "model", "choices"],
    "description": "One `data:` event of a stream; the stream ends with `data: [DONE]`. With "
                   "stream_options.include_usage the last chunk before [DONE] has `usage` and no choices.",
    "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": ref("Choice")},
        "usage": ref("Usage"),
    },
}
top_logprob = {
    "type": "object", "additionalProperties": False, "required": ["token", "logprob", "bytes"],
    "properties": {"token": {"type": "string"}, "logprob": {"type": "number", "maximum": 0},
                   "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}},
}
token_logprob = {
    "type": "object", "additionalProperties": False,
    "required": ["token", "logprob", "bytes", "top_logprobs"],
    "properties": dict(top_logprob["properties"],
                       top_logprobs={"type": "array", "items": ref("TopLogprob"),
                                     "description": "Likeliest first."}),
}
chat_logprobs = {
    "type": "object", "additionalProperties": False, "required": ["content"],
    "properties": {"content": {"type": "array", "items": ref("TokenLogprob")}},
}
chat_choice = {
    "type": "object", "additionalProperties": False,
    "required": ["index", "message", "finish_reason", "logprobs"],
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "message": {"type": "object", "additionalProperties": False, "required": ["role", "content"],
                    "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}},
        "finish_reason": {"enum": ["stop", "length"]},
        "logprobs": {"oneOf": [ref("ChatLogprobs"), {"type": "null"}]},
    },
}
chat_completion = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string", "pattern": "^chatcmpl-"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer", "description": "Unix seconds."},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": ref("ChatChoice"), "description": "Sorted by index."},
        "usage": ref("Usage"),
        "activations": {"type": "array", "items": ref("Activation")},
    },
}
chat_chunk = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "object", "created", "model", "choices"],
    "description": "One `data:` event of a streamed chat completion; a choice's first delta has "
                   "its role.",
    "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion.chunk"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["index", "delta", "finish_reason", "logprobs"],
            "properties": {
                "index": {"type": "integer", "minimum": 0},
                "delta": {"type": "object", "additionalProperties": False,
                          "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}}},
                "finish_reason": {"enum": ["stop", "length", None]},
                "logprobs": {"oneOf": [ref("ChatLogprobs"), {"type": "null"}]},
            }}},
        "usage": ref("Usage"),
    },
}
job = {
    "type": "object", "additionalProperties": False,
    "required": ["id", "request_id", "model", "status", "cancel_requested", "created_at", "started_at",
                 "finished_at", "expires_at", "result_expired", "status_url", "result_url", "usage_pending"],
    "properties": {
        "id": {"type": "string", "format": "uuid",
               "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"},
        "request_id": {"type": "string", "pattern": "^req_job_[0-9a-f]{32}$"},
        "model": {"type": "string"},
        "status": {"enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
        "cancel_requested": {"type": "boolean"},
        "created_at": TIME, "started_at": NTIME, "finished_at": NTIME,
        "expires_at": dict(NTIME, description="finished_at + retention (24 h by default)."),
        "result_expired": {"type": "boolean"},
        "status_url": {"type": "string", "pattern": "^/v1/completion-jobs/[0-9a-f-]{36}$"},
        "result_url": {"type": "string", "pattern": "^/v1/completion-jobs/[0-9a-f-]{36}/result$"},
        "usage_pending": {"type": "boolean"},
    },
}
job_list = {
    "type": "object", "additionalProperties": False, "required": ["object", "data", "has_more"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": ref("Job"), "description": "Newest first."},
        "first_id": {"type": "string"}, "last_id": {"type": "string"},
        "has_more": {"type": "boolean"},
    },
}
model = {
    "type": "object", "required": ["id", "object", "context_window", "n_layers", "d_model"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "context_window": {"type": "integer", "minimum": 1},
        "n_layers": {"type": "integer", "minimum": 1},
        "d_model": {"type": "integer", "minimum": 1},
        "vocab_size": {"type": "integer", "minimum": 1},
    },
}
model_list = {
    "type": "object", "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")},
                   "has_more": {"type": "boolean"}},
}
budget = {
    "type": "object", "additionalProperties": False,
    "required": ["tokens_left", "tokens_held", "running", "max_running"],
    "properties": {k: {"type": "integer", "minimum": 0}
                   for k in ("tokens_left", "tokens_held", "running", "max_running")},
}
error = {
    "type": "object", "additionalProperties": False, "required": ["error"],
    "properties": {"error": {
        "type": "object", "additionalProperties": False,
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"enum": ["invalid_request_error", "authentication_error", "insufficient_quota",
                              "rate_limit_error", "server_error"]},
            "param": {"type": ["string", "null"]},
            "code": {"type": ["string", "null"], "enum": [
                "invalid_json", "unknown_parameter", "missing_required_parameter", "invalid_type",
                "invalid_value", "context_length_exceeded", "chat_template_missing", "model_not_found",
                "invalid_api_key",
                "not_found", "unknown_route", "method_not_allowed", "request_too_large", "request_timeout",
                "budget_exhausted", "budget_held", "too_many_running", "too_many_queued_jobs",
                "rate_limit_exceeded",
                "invalid_idempotency_key",
                "idempotency_key_reused", "idempotency_key_in_use", "job_not_finished",
                "job_cancelled", "result_expired", "result_too_large", "overloaded", "internal_error", None]},
        },
    }},
}

H = {
    "XRequestId": {"description": "req_<32 hex>; req_job_<job id without dashes> on a job's responses.",
                   "schema": {"type": "string", "pattern": "^req_(job_)?[0-9a-f]{32}$"}, "required": True},
    "XRateLimitLimitRequests": {"description": "The key's running-request limit.",
                                "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "XRateLimitRemainingRequests": {"description": "How many more requests may run now.",
                                    "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "XBudgetRemainingTokens": {"description": "tokens_left − tokens_held.",
                               "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "RetryAfter": {"description": "Seconds to wait.", "schema": {"type": "string", "pattern": "^[0-9]+$"},
                   "required": True},
    "IdempotentReplayed": {"description": "true when an Idempotency-Key answered an existing job.",
                           "schema": {"const": "true"}},
}
RID = {"x-request-id": ref("XRequestId", "headers")}
TRAFFIC = dict(RID, **{
    "x-ratelimit-limit-requests": ref("XRateLimitLimitRequests", "headers"),
    "x-ratelimit-remaining-requests": ref("XRateLimitRemainingRequests", "headers"),
    "x-budget-remaining-tokens": ref("XBudgetRemainingTokens", "headers"),
})

# One event of a streamed completion (OpenAPI 3.2's `itemSchema`; in 3.1 the `schema`
# of `text/event-stream` is read as one event's by tools that check streams, such as
# Schemathesis): its data is a CompletionChunk as JSON, or the final "[DONE]".
def sse_event(chunk):
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"anyOf": [
                {"const": "[DONE]", "description": "The end of the stream."},
                {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": ref(chunk), "description": f"A {chunk} as JSON."},
            ]},
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }


SSE_EVENT = sse_event("CompletionChunk")


def err(desc, retry=False):
    headers = dict(RID)
    if retry:
        headers["retry-after"] = ref("RetryAfter", "headers")
    return {"description": desc, "headers": headers,
            "content": {"application/json": {"schema": ref("Error")}}}


responses = {
    "BadRequest": err("invalid_json, unknown_parameter, missing_required_parameter, invalid_type, "
                      "invalid_value, context_length_exceeded, chat_template_missing or "
                      "invalid_idempotency_key; `param` names the field at fault."),
    "Unauthorized": err("invalid_api_key: no, malformed, unknown or revoked key."),
    "BudgetExhausted": err("budget_exhausted (type insufficient_quota): the Hold can never fit the Budget."),
    "NotFound": err("not_found (a job this key cannot see), model_not_found or unknown_route."),
    "MethodNotAllowed": err("method_not_allowed."),
    "Conflict": err("job_not_finished, job_cancelled, or idempotency_key_in_use (with retry-after)."),
    "Gone": err("result_expired: past expires_at."),
    "TooLarge": err("request_too_large: the body is over the server's limit; as a failed Job's "
                    "result, result_too_large: its result was over the 16 MiB a stored result "
                    "may have."),
    "Unprocessable": err("idempotency_key_reused: the Idempotency-Key was used with another body."),
    "TooMany": err("budget_held (fits once running requests end), too_many_running, "
                   "too_many_queued_jobs, or rate_limit_exceeded (the key's requests or tokens "
                   "per minute; retry-after says when the next minute starts).", retry=True),
    "Timeout": err("request_timeout: the body did not arrive within the server's deadline."),
    "ServerError": err("internal_error or overloaded."),
}


def errs(*codes):
    names = {"400": "BadRequest", "401": "Unauthorized", "402": "BudgetExhausted", "404": "NotFound",
             "405": "MethodNotAllowed", "409": "Conflict", "410": "Gone", "408": "Timeout", "413": "TooLarge",
             "422": "Unprocessable", "429": "TooMany", "500": "ServerError", "503": "ServerError"}
    return {c: ref(names[c], "responses") for c in codes}


JOB_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
          "description": "The job's UUIDv7; anything else is 404 not_found."}
JOB_OK = {"headers": TRAFFIC, "content": {"application/json": {"schema": ref("Job")}}}

paths = {
    "/v1/models": {"get": {
        "operationId": "listModels", "summary": "The served models (an id and its aliases).",
        "security": [],
        "responses": {"200": {"description": "The models.", "headers": RID,
                              "content": {"application/json": {"schema": ref("ModelList")}}},
                      **errs("405")}}},
    "/v1/budget": {"get": {
        "operationId": "getBudget", "summary": "The key's Budget, Holds and running requests.",
        "responses": {"200": {"description": "The budget.", "headers": TRAFFIC,
                              "content": {"application/json": {"schema": ref("Budget")}}},
                      **errs("401", "405")}}},
    "/v1/completions": {"post": {
        "operationId": "createCompletion",
        "summary": "Sample completions of one or more prompts, whole or streamed.",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": ref("CompletionRequest")}}},
        "responses": {
            "200": {"description": "The Completion, or with stream: true server-sent events of "
                                   "CompletionChunk ending with `data: [DONE]`.",
                    "headers": TRAFFIC,
                    "content": {"application/json": {"schema": ref("Completion")},
                                "text/event-stream": {"schema": SSE_EVENT}}},
            **errs("400", "401", "402", "404", "405", "408", "413", "429", "500", "503")}}},
    "/v1/chat/completions": {"post": {
        "operationId": "createChatCompletion",
        "summary": "Sample n replies to one conversation, rendered by the model's chat template.",
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": ref("ChatCompletionRequest")}}},
        "responses": {
            "200": {"description": "The chat completion, or with stream: true server-sent events "
                                   "of ChatCompletionChunk ending with `data: [DONE]`.",
                    "headers": TRAFFIC,
                    "content": {"application/json": {"schema": ref("ChatCompletion")},
                                "text/event-stream": {"schema": sse_event("ChatCompletionChunk")}}},
            **errs("400", "401", "402", "404", "405", "408", "413", "429", "500", "503")}}},
    "/v1/completion-jobs": {
        "post": {
            "operationId": "createCompletionJob",
            "summary": "Submit a completions or chat request as a background Job.",
            "parameters": [{"name": "Idempotency-Key", "in": "header", "required": False,
                            "schema": {"type": "string", "minLength": 1, "maxLength": 255,
                                       "pattern": "^[\\x20-\\x7e]+$"},
                            "description": "Scoped to the API key, kept for the retention period."}],
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": {"oneOf": [
                                ref("CompletionJobRequest"), ref("ChatJobRequest")]}}}},
            "responses": {
                "202": dict(JOB_OK, description="The queued Job."),
                "200": {"description": "The Job an Idempotency-Key made already (same body).",
                        "headers": dict(TRAFFIC, **{"idempotent-replayed": ref("IdempotentReplayed", "headers")}),
                        "content": {"application/json": {"schema": ref("Job")}}},
                **errs("400", "401", "404", "405", "408", "409", "413", "422", "429", "500")}},
        "get": {
            "operationId": "listCompletionJobs", "summary": "The key's Jobs, newest first.",
            "parameters": [
                {"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
                {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": "A job id: list the jobs older than it."}],
            "responses": {"200": {"description": "A page of Jobs.", "headers": RID,
                                  "content": {"application/json": {"schema": ref("JobList")}}},
                          **errs("400", "401")}}},
    "/v1/completion-jobs/{id}": {"get": {
        "operationId": "getCompletionJob", "summary": "A Job.",
        "parameters": [JOB_ID],
        "responses": {"200": dict(JOB_OK, description="The Job."), **errs("401", "404", "405")}}},
    "/v1/completion-jobs/{id}/result": {"get": {
        "operationId": "getCompletionJobResult",
        "summary": "A succeeded Job's Completion (a chat completion for a chat body); a failed "
                   "Job's error with that error's own status.",
        "parameters": [JOB_ID],
        "responses": {"200": {"description": "The Completion or chat completion.", "headers": RID,
                              "content": {"application/json": {"schema": {"oneOf": [
                                  ref("Completion"), ref("ChatCompletion")]}}}},
                      **errs("400", "401", "402", "404", "405", "409", "410", "413", "429", "500",
                             "503")}}},
    "/v1/completion-jobs/{id}/cancel": {"post": {
        "operationId": "cancelCompletionJob",
        "summary": "Cancel a Job: a queued one at once, a running one at its next token.",
        "parameters": [JOB_ID],
        "responses": {"200": dict(JOB_OK, description="The Job, cancel_requested set."),
                      **errs("401", "404", "405")}}},
    "/openapi.json": {"get": {
        "operationId": "openapi", "summary": "This document.", "security": [],
        "responses": {"200": {"description": "The OpenAPI document.", "headers": RID,
                              "content": {"application/json": {"schema": {"type": "object"}}}}}}},
    "/health": {"get": {
        "operationId": "health", "summary": "Liveness.", "security": [],
        "responses": {"200": {"description": "ok", "headers": RID,
                              "content": {"text/plain": {"schema": {"const": "ok"}}}}}}},
}

doc = {
    "openapi": "3.1.0",
    "info": {"title": "ACS API", "version": "1.0.0",
             "description": "The ACS contract (shared/API.md): legacy-Completions-style sampling of many "
                            "rollouts and chat completions, token Budgets with Holds, background Jobs, "
                            "steering and activations. "
                            "Every error is {\"error\":{message,type,param,code}}; every response carries "
                            "x-request-id."},
    "servers": [{"url": "/"}],
    "security": [{"bearerAuth": []}],
    "paths": paths,
    "components": {
        "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer",
                                           "description": "Authorization: Bearer <key>"}},
        "headers": H,
        "responses": responses,
        "schemas": {
            "CompletionRequest": completion_request, "CompletionJobRequest": job_request,
            "SteeringEntry": steering_entry, "ActivationsRequest": activations_req,
            "Completion": completion, "CompletionChunk": chunk, "Choice": choice, "Usage": usage,
            "Logprobs": logprobs, "Activation": activation, "Job": job, "JobList": job_list,
            "Model": model, "ModelList": model_list, "Budget": budget, "Error": error,
            "ChatCompletionRequest": chat_request, "ChatJobRequest": chat_job_request,
            "ChatMessage": chat_message, "TextPart": text_part, "ChatCompletion": chat_completion,
            "ChatCompletionChunk": chat_chunk, "ChatChoice": chat_choice,
            "ChatLogprobs": chat_logprobs, "TokenLogprob": token_logprob, "TopLogprob": top_logprob,
        },
    },
}

if __name__ == "__main__":
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {OUT}")
