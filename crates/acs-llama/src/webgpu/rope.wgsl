// Rotates adjacent pairs (ggml's "normal" RoPE) of every head of every row of X by the
// row's angles. CS holds (cos, sin) per row and pair, computed on the host exactly as
// the CPU path computes them: GPU sin/cos lose precision at large positions.

struct Params {
    rows: u32,
    width: u32,
    head_dim: u32,
    pairs: u32,
}

@group(0) @binding(0) var<storage, read_write> X: array<f32>;
@group(0) @binding(1) var<storage, read> CS: array<f32>;
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let heads = P.width / P.head_dim;
    if i >= P.rows * heads * P.pairs {
        return;
    }
    let pair = i % P.pairs;
    let head = (i / P.pairs) % heads;
    let row = i / (P.pairs * heads);
    let at = row * P.width + head * P.head_dim + 2u * pair;
    let cs = (row * P.pairs + pair) * 2u;
    let c = CS[cs];
    let s = CS[cs + 1u];
    let a = X[at];
    let b = X[at + 1u];
    X[at] = a * c - b * s;
    X[at + 1u] = a * s + b * c;
}
