// Y[b * out_stride + row0 + r] = W[r] · X[b] for the rows of one weight buffer (a
// tensor larger than the device's binding limit comes in several) and every vector of
// the batch; with `accumulate` set, Y[...] += W[r] · X[b] instead: the residual adds
// of the attention and feed-forward outputs, without a dispatch of their own.
//
// A workgroup takes ROWS rows and up to TILE vectors (the host prepends ROWS and
// LANES, ROWS * LANES = 64, chosen per adapter). Each row gets LANES threads,
// which read its blocks of 32 in turn (lane k takes blocks k, k + LANES, ...), so that
// neighbouring threads read neighbouring bytes and a row of any length keeps them all
// busy; each block is expanded once and dotted against every vector of the tile. The
// lanes' partial sums then meet in workgroup memory. Decode (one vector per sequence)
// is bound by reading the weights, and this is the access pattern that reads them at
// the device's bandwidth: coalesced, each byte once per tile.

struct Params {
    rows: u32,
    row0: u32,
    out_stride: u32,
    cols: u32,
    batch: u32,
    row_bytes: u32,
    accumulate: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const TILE: u32 = 8u;

// Writes one result, adding it to what is there when the pass accumulates.
fn put(at: u32, v: f32) {
    if P.accumulate != 0u {
        Y[at] += v;
    } else {
        Y[at] = v;
    }
}

// [vector][thread] partial sums.
var<workgroup> part: array<f32, 512>;

@compute @workgroup_size(64)
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
                let xo = (b0 + b) * P.cols + 32u * c;
                var s = 0.0;
                for (var j = 0u; j < 32u; j++) {
                    s += y[j] * X[xo + j];
                }
                acc[b] += s;
            }
        }
    }
    if LANES == 1u {
        if r < P.rows {
            for (var b = 0u; b < nb; b++) {
                put((b0 + b) * P.out_stride + P.row0 + r, acc[b]);
            }
        }
        return;
    }
    for (var b = 0u; b < nb; b++) {
        part[b * 64u + lid] = acc[b];
    }
    workgroupBarrier();
    // Tree sum over each row's lanes: LANES/2, LANES/4, ... 1.
    for (var w = LANES / 2u; w > 0u; w = w / 2u) {
        if lane < w {
            for (var b = 0u; b < nb; b++) {
                part[b * 64u + lid] += part[b * 64u + lid + w];
            }
        }
        workgroupBarrier();
    }
    if lane == 0u && r < P.rows {
        for (var b = 0u; b < nb; b++) {
            put((b0 + b) * P.out_stride + P.row0 + r, part[b * 64u + lid]);
        }
    }
}
