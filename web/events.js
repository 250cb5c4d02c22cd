// Server-sent events of a streamed completion or chat completion: each `data:` chunk
// to `onChunk`, until `data: [DONE]`. A chunk that carries an error ends the stream
// with that error; the usage chunk (stream_options.include_usage) is returned.
export async function readEvents(resp, onChunk) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let usage = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return usage;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.replace(/^data: /, "");
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(`${chunk.error.code}: ${chunk.error.message}`);
      if (chunk.usage) usage = chunk.usage;
      onChunk(chunk);
    }
  }
}
