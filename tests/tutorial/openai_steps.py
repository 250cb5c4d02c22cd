"""The tutorial's Python steps with the openai SDK, against ACS_API_BASE / ACS_API_KEY.

Prints what the tutorial's programs print: for two prompts with n=2, each choice's
prompt number, choice number and text, then prompt and generated tokens; then the
texts of 8 requests sent at once; then four chat replies to one conversation, whole and
streamed. The last line is a JSON summary for the test.
"""
import concurrent.futures
import json
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ["ACS_API_BASE"], api_key=os.environ["ACS_API_KEY"])

n = 2
completion = client.completions.create(
    model="llama-8b", prompt=["The sky is", "The grass is"], n=n, max_tokens=2
)
for choice in completion.choices:
    print(choice.index // n, choice.index % n, repr(choice.text))
print(completion.usage.prompt_tokens, completion.usage.completion_tokens)


def one(_):
    c = client.completions.create(model="llama-8b", prompt="The sky is", max_tokens=2)
    return c.choices[0].text


with concurrent.futures.ThreadPoolExecutor(8) as pool:
    texts = list(pool.map(one, range(8)))
for t in texts:
    print(repr(t))

stream = client.completions.create(
    model="llama-8b", prompt=["The sky is", "The grass is"], n=2, max_tokens=3, stream=True
)
streamed = {}
for chunk in stream:
    for c in chunk.choices:
        streamed[c.index] = streamed.get(c.index, "") + c.text

# Chat: four replies to one conversation, whole and streamed.
messages = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name a colour."},
]
reply = client.chat.completions.create(
    model="llama-8b", messages=messages, n=4, max_completion_tokens=8, seed=1
)
for choice in reply.choices:
    print(choice.index, choice.message.role, repr(choice.message.content), choice.finish_reason)
print(reply.usage.prompt_tokens, reply.usage.completion_tokens)

chat_stream = client.chat.completions.create(
    model="llama-8b", messages=messages, n=4, max_completion_tokens=8, seed=1, stream=True,
    stream_options={"include_usage": True},
)
chat_streamed, roles, chat_usage = {}, {}, None
for chunk in chat_stream:
    if chunk.usage is not None:
        chat_usage = chunk.usage.model_dump()
    for c in chunk.choices:
        if c.delta.role:
            roles[c.index] = c.delta.role
        chat_streamed[c.index] = chat_streamed.get(c.index, "") + (c.delta.content or "")

print(json.dumps({
    "indexes": [c.index for c in completion.choices],
    "usage": completion.usage.model_dump(),
    "parallel": len(texts),
    "streamed_indexes": sorted(streamed),
    "chat_object": reply.object,
    "chat_indexes": [c.index for c in reply.choices],
    "chat_usage": reply.usage.model_dump(),
    "chat_texts": [c.message.content for c in reply.choices],
    "chat_streamed": [chat_streamed[i] for i in sorted(chat_streamed)],
    "chat_roles": [roles[i] for i in sorted(roles)],
    "chat_stream_usage": chat_usage,
}))
