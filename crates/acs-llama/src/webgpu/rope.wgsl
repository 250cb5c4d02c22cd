// Rotates adjacent pairs (ggml's "normal" RoPE) of every head of every row of Q and
// of K (one dispatch for both) by the row's angles. CS holds (cos, sin) per row and pair, computed on the host exactly as
// the CPU path computes them: GPU sin/cos lose precision at large positions.

struct Params {
    rows: u32,
    q_width: u32,
    k_width: u32,
    head_dim: u32,
    pairs: u32,
}

@group(0) @binding(0) var<storage, read_write> Q: array<f32>;
@group(0) @binding(1) var<storage, read_write> K: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let all = gid.x + gid.y * nwg.x * 64u;
    let q_heads = P.q_width / P.head_dim;
    let k_heads = P.k_width / P.head_dim;
    let in_q = P.rows * q_heads * P.pairs;
    if all >= in_q + P.rows * k_heads * P.pairs {
        return;
    }
    // The first `in_q` threads rotate Q, the rest K.
    let is_q = all < in_q;
    let i = select(all - in_q, all, is_q);
    let heads = select(k_heads, q_heads, is_q);
    let width = select(P.k_width, P.q_width, is_q);
    let pair = i % P.pairs;
    let head = (i / P.pairs) % heads;
    let row = i / (P.pairs * heads);
    let at = row * width + head * P.head_dim + 2u * pair;
    let cs = (row * P.pairs + pair) * 2u;
    let c = CS[cs];
    let s = CS[cs + 1u];
    if is_q {
        let a = Q[at];
        let b = Q[at + 1u];
        Q[at] = a * c - b * s;
        Q[at + 1u] = a * s + b * c;
    } else {
        let a = K[at];
        let b = K[at + 1u];
        K[at] = a * c - b * s;
        K[at + 1u] = a * s + b * c;
    }
}
