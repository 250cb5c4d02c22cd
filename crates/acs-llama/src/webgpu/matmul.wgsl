// Y[b * out_stride + row0 + r] = W[r] · X[b] for the rows of one weight buffer (a
// tensor larger than the device's binding limit comes in several) and every vector of
// the batch. One thread per weight row and tile of vectors: a block is expanded once
// and dotted against TILE vectors before the next, as the CPU kernels do.

struct Params {
    rows: u32,
    row0: u32,
    out_stride: u32,
    cols: u32,
    batch: u32,
    row_bytes: u32,
}

@group(0) @binding(0) var<storage, read> W: array<u32>;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

const TILE: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if r >= P.rows {
        return;
    }
    let b0 = gid.y * TILE;
    let nb = min(TILE, P.batch - b0);
    var acc: array<f32, TILE>;
    let o = r * P.row_bytes;
    for (var c = 0u; c < P.cols / 32u; c++) {
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
    for (var b = 0u; b < nb; b++) {
        Y[(b0 + b) * P.out_stride + P.row0 + r] = acc[b];
    }
}
