// Causal grouped-query attention of one sequence's new rows against its cache and
// themselves, with the operations of model.rs's attention in order. One workgroup per
// (new row, head): scores into S, softmax, then the weighted sum of values. The step's
// rows of QKV hold each row's queries, keys and values side by side (`stride` floats
// a row). The cache holds half floats, two to a word (half.wgsl, prepended); the
// workgroups of each key/value head's first query head also store their row's new
// keys and values there, and every workgroup reads the new positions from QKV,
// rounded as the cache holds them, so that the store needs no dispatch (and no
// barrier) of its own. With `round` set, the output is rounded to 8-bit blocks of 32
// (round8.wgsl, prepended; the host sets it where heads are whole blocks, at most
// MAX_HEAD wide), the input the output projection reads, without a dispatch of its own.
//
// The host prepends the constants it shares with this kernel (`WG`, threads per
// workgroup, `MAX_HEAD`) and `struct Params`, the uniform `P`, generated from kernels/attention.rs.

@group(0) @binding(0) var<storage, read> QKV: array<f32>;
@group(0) @binding(1) var<storage, read_write> CK: array<u32>;
@group(0) @binding(2) var<storage, read_write> CV: array<u32>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<uniform> P: Params;

var<workgroup> red: array<f32, WG>;

// The head's output, for rounding by blocks.
var<workgroup> head: array<f32, MAX_HEAD>;

// Keys e and e + 1 (e even) of position t, from the head whose first key is `ko`: from
// the cache before this step's rows, from QKV for them.
fn key_pair(t: u32, ko: u32, e: u32) -> vec2<f32> {
    if t < P.pos0 {
        return unpack2x16float(CK[(t * P.kv + ko + e) / 2u]);
    }
    let at = (P.row0 + t - P.pos0) * P.stride + P.d + ko + e;
    return unpack2x16float(half_pair(QKV[at], QKV[at + 1u]));
}

// The values of position t, as `key_pair`.
fn value_pair(t: u32, ko: u32, e: u32) -> vec2<f32> {
    if t < P.pos0 {
        return unpack2x16float(CV[(t * P.kv + ko + e) / 2u]);
    }
    let at = (P.row0 + t - P.pos0) * P.stride + P.d + P.kv + ko + e;
    return unpack2x16float(half_pair(QKV[at], QKV[at + 1u]));
}

// Combines every thread's `v` with `op` (0: max, 1: sum) and returns the result to all.
fn reduce(lid: u32, v: f32, op: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
        if lid < w {
            if op == 0u {
                red[lid] = max(red[lid], red[lid + w]);
            } else {
                red[lid] += red[lid + w];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let i = wg.x;
    let h = wg.y;
    let n = P.pos0 + i + 1u;
    // A sliding-window layer's row sees its last `window` positions only.
    var first = 0u;
    if P.window != 0u && n > P.window {
        first = n - P.window;
    }
    let qo = (P.row0 + i) * P.stride + h * P.head_dim;
    let oo = (P.row0 + i) * P.d + h * P.head_dim;
    let ko = (h / P.group) * P.head_dim;
    let so = (i * P.n_heads + h) * P.s_stride;

    if h % P.group == 0u {
        // Heads start at even values (head_dim is even), so pairs never straddle words.
        let src = (P.row0 + i) * P.stride + P.d + ko;
        let dst = ((P.pos0 + i) * P.kv + ko) / 2u;
        for (var w = lid; w < P.head_dim / 2u; w += WG) {
            let k = src + 2u * w;
            CK[dst + w] = half_pair(QKV[k], QKV[k + 1u]);
            CV[dst + w] = half_pair(QKV[k + P.kv], QKV[k + P.kv + 1u]);
        }
    }

    // -FLT_MAX by its bits: Chrome (Tint) rejects the rounded decimal -3.4028235e38
    // as out of range, where naga accepts it.
    var m = bitcast<f32>(0xff7fffffu);
    for (var t = first + lid; t < n; t += WG) {
        var s = 0.0;
        for (var e = 0u; e < P.head_dim; e += 2u) {
            let k = key_pair(t, ko, e);
            s += QKV[qo + e] * k.x;
            s += QKV[qo + e + 1u] * k.y;
        }
        s = s * P.scale;
        S[so + t] = s;
        m = max(m, s);
    }
    let mx = reduce(lid, m, 0u);
    var sum = 0.0;
    for (var t = first + lid; t < n; t += WG) {
        let p = exp(S[so + t] - mx);
        S[so + t] = p;
        sum += p;
    }
    let total = reduce(lid, sum, 1u);
    storageBarrier();
    for (var e = lid; e < P.head_dim; e += WG) {
        var acc = 0.0;
        for (var t = first; t < n; t++) {
            let v = value_pair(t, ko, e & ~1u);
            acc += S[so + t] / total * select(v.x, v.y, (e & 1u) == 1u);
        }
        if P.round == 0u {
            O[oo + e] = acc;
        } else {
            head[e] = acc;
        }
    }
    if P.round != 0u {
        workgroupBarrier();
        if lid < P.head_dim / 32u {
            let b = 32u * lid;
            var block: array<f32, 32>;
            for (var j = 0u; j < 32u; j++) {
                block[j] = head[b + j];
            }
            round8_block(&block);
            for (var j = 0u; j < 32u; j++) {
                O[oo + b + j] = block[j];
            }
        }
    }
}
