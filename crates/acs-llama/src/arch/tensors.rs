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
    /// Block `l`'s tensors: `matrix(state, name, cols, rows)` and
    /// `vector(state, name, len)` provide each one.
    pub(crate) fn load<S, E>(
        c: &ModelConfig,
        l: usize,
        state: &mut S,
        matrix: impl Fn(&mut S, &str, usize, usize) -> Result<M, E>,
        vector: impl Fn(&mut S, &str, usize) -> Result<V, E>,
    ) -> Result<Self, E> {
        let n = |part: &str| format!("blk.{l}.{part}.weight");
        let bias = |part: &str| format!("blk.{l}.{part}.bias");
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let recipe = c.recipe();
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
            wq: matrix(state, &n("attn_q"), d, q)?,
            wk: matrix(state, &n("attn_k"), d, kv)?,
            wv: matrix(state, &n("attn_v"), d, kv)?,
            wo: matrix(state, &n("attn_output"), q, d)?,
            ffn_norm: vector(state, &n("ffn_norm"), d)?,
            gate: matrix(state, &n("ffn_gate"), d, c.ffn)?,
            up: matrix(state, &n("ffn_up"), d, c.ffn)?,
            down: matrix(state, &n("ffn_down"), c.ffn, d)?,
        })
    }
}
