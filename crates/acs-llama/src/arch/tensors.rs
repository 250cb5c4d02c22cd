//! The tensors of a model as GGUF names them: those outside the blocks, and one
//! block's, with their shapes written once for every backend.

use super::ModelConfig;

/// The GGUF names of the tensors outside the blocks.
pub(crate) const EMBED: &str = "token_embd.weight";
/// The output projection; absent when it is tied to [`EMBED`].
pub(crate) const OUTPUT: &str = "output.weight";
/// The final norm.
pub(crate) const OUTPUT_NORM: &str = "output_norm.weight";
/// RoPE's per-pair frequency factors (`rope_dims / 2` of them), where the file has
/// them (Llama 3.1 and 3.2).
pub(crate) const ROPE_FREQS: &str = "rope_freqs.weight";

/// Where a matrix of a block lies in the file: a tensor of its own, or rows of one
/// it shares (the fused projections of Phi-3).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatrixRef<'a> {
    /// The tensor's GGUF name.
    pub(crate) name: &'a str,
    /// Values per row.
    pub(crate) cols: usize,
    /// The matrix's rows.
    pub(crate) rows: usize,
    /// Its first row in the tensor.
    pub(crate) first_row: usize,
    /// The tensor's rows, all its matrices'.
    pub(crate) tensor_rows: usize,
}

impl<'a> MatrixRef<'a> {
    /// A tensor of `rows` × `cols`, whole.
    pub(crate) fn whole(name: &'a str, cols: usize, rows: usize) -> Self {
        MatrixRef {
            name,
            cols,
            rows,
            first_row: 0,
            tensor_rows: rows,
        }
    }

    /// Rows `first .. first + len` of a tensor of `tensor_rows`.
    pub(crate) fn part(
        name: &'a str,
        cols: usize,
        (first, len, tensor_rows): (usize, usize, usize),
    ) -> Self {
        MatrixRef {
            name,
            cols,
            rows: len,
            first_row: first,
            tensor_rows,
        }
    }
}

/// One block's tensors, a matrix `M` or a norm vector `V` each: the CPU's mapped
/// tensors and f32 norms, the WebGPU backend's device buffers, or nothing while the
/// loader lists what it needs. Their GGUF names and shapes are written once, in
/// [`BlockTensors::load`].
#[derive(Debug)]
pub(crate) struct BlockTensors<M, V> {
    pub(crate) attn_norm: V,
    pub(crate) wq: M,
    pub(crate) wk: M,
    pub(crate) wv: M,
    pub(crate) wo: M,
    /// The query, key and value projections' biases, where the family has them.
    pub(crate) qkv_bias: Option<[V; 3]>,
    /// The query and key heads' norms (`head_dim` each), where the family has them.
    pub(crate) qk_norm: Option<[V; 2]>,
    /// The norms of the attention and MLP outputs, where the family has them.
    pub(crate) post_norms: Option<[V; 2]>,
    pub(crate) ffn_norm: V,
    pub(crate) gate: M,
    pub(crate) up: M,
    pub(crate) down: M,
}

impl<M, V> BlockTensors<M, V> {
    /// Block `l`'s tensors: `matrix(state, where)` and `vector(state, name, len)`
    /// provide each one. A family with fused projections gets the query, key and
    /// value matrices as rows of `attn_qkv`, and the gate and up ones as rows of
    /// `ffn_up` (gate first), in that order.
    pub(crate) fn load<S, E>(
        c: &ModelConfig,
        l: usize,
        state: &mut S,
        matrix: impl Fn(&mut S, MatrixRef<'_>) -> Result<M, E>,
        vector: impl Fn(&mut S, &str, usize) -> Result<V, E>,
    ) -> Result<Self, E> {
        let n = |part: &str| format!("blk.{l}.{part}.weight");
        let (whole, part) = (MatrixRef::whole, MatrixRef::part);
        let bias = |part: &str| format!("blk.{l}.{part}.bias");
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let recipe = c.recipe();
        let (qkv, ffn_up) = (n("attn_qkv"), n("ffn_up"));
        let names = [n("attn_q"), n("attn_k"), n("attn_v"), n("ffn_gate")];
        let (wo, down) = (n("attn_output"), n("ffn_down"));
        let [wq, wk, wv, gate, up] = if recipe.fused {
            let rows = q + 2 * kv;
            [
                part(&qkv, d, (0, q, rows)),
                part(&qkv, d, (q, kv, rows)),
                part(&qkv, d, (q + kv, kv, rows)),
                part(&ffn_up, d, (0, c.ffn, 2 * c.ffn)),
                part(&ffn_up, d, (c.ffn, c.ffn, 2 * c.ffn)),
            ]
        } else {
            [
                whole(&names[0], d, q),
                whole(&names[1], d, kv),
                whole(&names[2], d, kv),
                whole(&names[3], d, c.ffn),
                whole(&ffn_up, d, c.ffn),
            ]
        };
        let qkv_bias = if recipe.qkv_bias {
            Some([
                vector(state, &bias("attn_q"), q)?,
                vector(state, &bias("attn_k"), kv)?,
                vector(state, &bias("attn_v"), kv)?,
            ])
        } else {
            None
        };
        let qk_norm = if recipe.qk_norm {
            Some([
                vector(state, &n("attn_q_norm"), c.head_dim)?,
                vector(state, &n("attn_k_norm"), c.head_dim)?,
            ])
        } else {
            None
        };
        let post_norms = if recipe.post_norms {
            Some([
                vector(state, &n("post_attention_norm"), d)?,
                vector(state, &n("post_ffw_norm"), d)?,
            ])
        } else {
            None
        };
        Ok(BlockTensors {
            qkv_bias,
            qk_norm,
            post_norms,
            attn_norm: vector(state, &n("attn_norm"), d)?,
            wq: matrix(state, wq)?,
            wk: matrix(state, wk)?,
            wv: matrix(state, wv)?,
            wo: matrix(state, whole(&wo, q, d))?,
            ffn_norm: vector(state, &n("ffn_norm"), d)?,
            gate: matrix(state, gate)?,
            up: matrix(state, up)?,
            down: matrix(state, whole(&down, c.ffn, d))?,
        })
    }
}
