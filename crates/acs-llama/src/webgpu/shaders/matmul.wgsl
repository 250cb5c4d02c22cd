// Y[b * out_stride + row0 + r] = W[r] · X[b] for the rows of one weight buffer (a
// tensor larger than the device's binding limit comes in several) and every vector of
// the batch; with `accumulate` set, Y[...] += W[r] · X[b] instead: the residual adds
// of the attention and feed-forward outputs, without a dispatch of their own. Output
// columns below `rope_end` (the queries and keys) come out rotated by RoPE: ggml's
// "normal" mode, adjacent pairs of the first `rope_dims` of each head of `head_dim`,
// by CS's (cos, sin) per vector and pair, computed on the host exactly as the CPU path
// computes them (GPU sin/cos lose precision at large positions). A pair's two rows
// are always in one workgroup (ROWS is even, and so is every buffer's first row).
//
// A workgroup takes ROWS rows and up to TILE vectors (the host prepends ROWS and
// LANES, ROWS * LANES = WG, chosen per adapter, and ROPE, whether this pipeline
// applies RoPE). Each row gets LANES threads, which read its blocks of 32 in turn
// (lane k takes blocks k, k + LANES, ...), so that neighbouring threads read
// neighbouring bytes and a row of any length keeps them all busy; each block is expanded once and dotted against every vector of the tile. The
// lanes' partial sums then meet in workgroup memory. Decode (one vector per sequence)
// is bound by reading the weights, and this is the access pattern that reads them at
// the device's bandwidth: coalesced, each byte once per tile.
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup, `TILE`) and `struct Params`, the uniform `P`, generated from kernels/matmul.rs.

@group(0) @binding(0) var<storage, read> W: array<u32>;
// The vectors, four values a load (a row's length is whole blocks of 32).
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<storage, read> CS: array<f32>;
@group(0) @binding(4) var<uniform> P: Params;

// Writes one result, adding it to what is there when the pass accumulates.
fn put(at: u32, v: f32) {
    if P.accumulate != 0u {
        Y[at] += v;
    } else {
        Y[at] = v;
    }
}

// [vector][thread] partial sums.
var<workgroup> part: array<f32, TILE * WG>;

// The result of output column `col` for vector `v`: `own`, or where RoPE applies, its
// pair rotated, `other` being the pair's other value.
fn rotated(col: u32, v: u32, own: f32, other: f32) -> f32 {
    if col >= P.rope_end {
        return own;
    }
    let e = col % P.head_dim;
    if e >= P.rope_dims {
        return own;
    }
    let cs = (v * (P.rope_dims / 2u) + e / 2u) * 2u;
    let c = CS[cs];
    let s = CS[cs + 1u];
    if (col & 1u) == 0u {
        return own * c - other * s;
    }
    return other * s + own * c;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let r = wg.x * ROWS + lid / LANES;
    let b0 = wg.y * TILE;
    let nb = min(TILE, P.batch - b0);
    var acc: array<f32, TILE>;
    if r < P.rows {
        let o = r * P.row_bytes;
        for (var c = lane; c < P.cols / 32u; c += LANES) {
            fill(o, c);
            for (var b = 0u; b < nb; b++) {
                let xo = ((b0 + b) * P.cols + 32u * c) / 4u;
                var s = 0.0;
                for (var j = 0u; j < 8u; j++) {
                    let x = X[xo + j];
                    s += y[4u * j] * x.x;
                    s += y[4u * j + 1u] * x.y;
                    s += y[4u * j + 2u] * x.z;
                    s += y[4u * j + 3u] * x.w;
                }
                acc[b] += s;
            }
        }
    }
    let col = P.row0 + r;
    if LANES == 1u {
        // With a thread per row, a row's pair is the neighbouring thread's. Only the
        // pipeline for RoPE has this barrier: adapters that run on the CPU (this
        // layout's) pay for any barrier in a kernel in all of its work.
        if ROPE {
            for (var b = 0u; b < nb; b++) {
                part[b * WG + lid] = acc[b];
            }
            workgroupBarrier();
        }
        if r < P.rows {
            for (var b = 0u; b < nb; b++) {
                var v = acc[b];
                if ROPE {
                    v = rotated(col, b0 + b, v, part[b * WG + (lid ^ 1u)]);
                }
                put((b0 + b) * P.out_stride + col, v);
            }
        }
        return;
    }
    for (var b = 0u; b < nb; b++) {
        part[b * WG + lid] = acc[b];
    }
    workgroupBarrier();
    // Tree sum over each row's lanes: LANES/2, LANES/4, ... 1.
    for (var w = LANES / 2u; w > 0u; w = w / 2u) {
        if lane < w {
            for (var b = 0u; b < nb; b++) {
                part[b * WG + lid] += part[b * WG + lid + w];
            }
        }
        workgroupBarrier();
    }
    if lane == 0u && r < P.rows {
        for (var b = 0u; b < nb; b++) {
            // The pair's other row sums in the neighbouring group of lanes.
            var v = part[b * WG + lid];
            if ROPE {
                v = rotated(col, b0 + b, v, part[b * WG + (lid ^ LANES)]);
            }
            put((b0 + b) * P.out_stride + col, v);
        }
    }
}
