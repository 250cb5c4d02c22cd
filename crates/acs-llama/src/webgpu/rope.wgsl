// Rotates adjacent pairs (ggml's "normal" RoPE) of every query and key head of every
// row of QKV by the row's angles, in one dispatch. A row holds its queries, then its
// keys, then its values (the attention's input projections write them side by side),
// so the heads to rotate are a row's first `heads` (query heads and key heads
// together). CS holds (cos, sin) per row and pair, computed on the host exactly as
// the CPU path computes them: GPU sin/cos lose precision at large positions.

struct Params {
    rows: u32,
    stride: u32,
    heads: u32,
    head_dim: u32,
    pairs: u32,
}

@group(0) @binding(0) var<storage, read_write> QKV: array<f32>;
@group(0) @binding(1) var<storage, read> CS: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i >= P.rows * P.heads * P.pairs {
        return;
    }
    let pair = i % P.pairs;
    let head = (i / P.pairs) % P.heads;
    let row = i / (P.pairs * P.heads);
    let at = row * P.stride + head * P.head_dim + 2u * pair;
    let cs = (row * P.pairs + pair) * 2u;
    let c = CS[cs];
    let s = CS[cs + 1u];
    let a = QKV[at];
    let b = QKV[at + 1u];
    QKV[at] = a * c - b * s;
    QKV[at + 1u] = a * s + b * c;
}
