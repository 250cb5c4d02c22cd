//! The forward step: a batch's new tokens through every block into logits, recorded
//! as one list of dispatches and copies and submitted once; only the logits of the
//! rows that sample (and any captured activations) come back.

use std::ops::Range;

use crate::error::ModelError;
use crate::model::{Logits, SeqOutput};

use super::device::ErrorScopes;
use super::error::GpuError;
use super::kernels::matmul::{self, Store, Target};
use super::kernels::{MAX_GROUPS, add, attention, embed, head_norm, quantize, rms_norm, rope};
use super::profile::{Kernel, StepProfile};
use super::recorder::{Dest, Recorder};
use super::tensor::{GpuBlock, GpuTensor, f32_bytes};
use super::{GpuModel, GpuSeqInput};

/// Where the batch's rows lie in the step.
#[derive(Debug)]
struct Plan {
    /// Each sequence's new rows among the step's.
    spans: Vec<Range<usize>>,
    /// Rows of the step.
    total: usize,
    /// Attention scores of the sequence with the most.
    score_floats: usize,
}

/// The step's inputs on the device.
#[derive(Debug)]
struct Inputs {
    tokens: wgpu::Buffer,
    /// RoPE's (cos, sin) per row and pair, computed as the CPU path computes them.
    rope: wgpu::Buffer,
    /// The same for the sliding-window layers, where they turn at another base.
    rope_local: Option<wgpu::Buffer>,
    /// The steering vectors end to end.
    steer: wgpu::Buffer,
    /// (layer, sequence, offset of its vector in `steer`)
    steer_at: Vec<(usize, usize, usize)>,
}

/// What the step reads back: captures first, then logits.
#[derive(Debug)]
struct Reads {
    /// (layer, sequence, float offset in the read-back)
    capture_at: Vec<(usize, usize, usize)>,
    /// Where the logits start.
    logits_at: usize,
    /// The rows whose logits come back, in order.
    logit_rows: Vec<usize>,
    /// Floats read back.
    floats: usize,
}

/// The step's activations, each a row per new token.
#[derive(Debug)]
struct Activations {
    /// The residual stream.
    x: wgpu::Buffer,
    /// `x` normalized.
    xn: wgpu::Buffer,
    /// A matmul input rounded to 8-bit blocks.
    xq: wgpu::Buffer,
    /// Each row's queries, keys and values side by side, as one matmul writes them.
    qkv: wgpu::Buffer,
    attn: wgpu::Buffer,
    /// A block's attention or MLP output before its norm, where the family norms
    /// them before the residual add.
    proj: wgpu::Buffer,
    /// Each row's gate and up projections side by side.
    gate_up: wgpu::Buffer,
    act: wgpu::Buffer,
    scores: wgpu::Buffer,
}

impl GpuModel {
    /// One step, its profile too when `profile` (see [`GpuModel::profile_async`]).
    pub(super) async fn step(
        &self,
        batch: &mut [GpuSeqInput<'_>],
        profile: bool,
    ) -> Result<(Vec<SeqOutput>, Option<StepProfile>), GpuError> {
        self.check_lost()?;
        let plan = self.plan(batch)?;
        let mut outputs: Vec<SeqOutput> = batch.iter().map(|_| SeqOutput::default()).collect();
        if plan.total == 0 {
            return Ok((outputs, None));
        }
        let grown = self.check_room(batch, &plan)?;
        let scopes = ErrorScopes::push(&self.device);
        // A step running at the same time (none does: the engine runs one at a time)
        // would find the arena taken and use fresh buffers.
        let arena = self
            .arena
            .lock()
            .ok()
            .and_then(|mut a| a.take())
            .unwrap_or_default();
        let mut rec = Recorder::new(&self.device, &self.queue, &self.limits, arena);
        for (s, cap) in batch.iter_mut().zip(grown) {
            if let Some(cap) = cap {
                self.grow(s.cache, cap, &mut rec);
            }
        }
        let inputs = self.upload_inputs(&mut rec, batch, plan.total);
        let reads = self.reads(batch, &plan);
        let bufs = self.activations(&mut rec, &plan);

        let (t, d) = (plan.total, self.config.d_model);
        let embed_bufs = (&inputs.tokens, &bufs.x);
        let scale = match self.config.recipe().scaled_embedding {
            true => (d as f32).sqrt(),
            false => 1.0,
        };
        let embed = (&self.pipes.embed, &self.embed);
        embed::record(&mut rec, embed.0, embed.1, embed_bufs, t, (d, scale));
        for (l, b) in self.blocks.iter().enumerate() {
            let rope = match &inputs.rope_local {
                Some(local) if self.config.is_local(l) => local,
                _ => &inputs.rope,
            };
            self.attention(&mut rec, (l, b), batch, &plan, &bufs, rope);
            self.feed_forward(&mut rec, b, &bufs, t);
            self.steer_and_capture(&mut rec, l, &plan, &bufs.x, &inputs, &reads);
        }
        self.logits(&mut rec, &bufs, &reads);

        let (data, timed) = self
            .submit(rec, batch, reads.floats, profile, scopes)
            .await?;
        for s in batch.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        for &(l, si, at) in &reads.capture_at {
            let n = plan.spans[si].len() * d;
            outputs[si].captured.push((l, data[at..at + n].to_vec()));
        }
        let mut at = reads.logits_at;
        for (s, out) in batch.iter().zip(&mut outputs) {
            let n = logit_count(s) * self.config.vocab;
            out.logits = data[at..at + n].to_vec();
            at += n;
        }
        Ok((outputs, timed))
    }

    /// Checks the batch against the model (context, vocabulary, steering vectors)
    /// and lays out its rows.
    fn plan(&self, batch: &[GpuSeqInput<'_>]) -> Result<Plan, GpuError> {
        let c = &self.config;
        let mut spans = Vec::with_capacity(batch.len());
        let mut total = 0usize;
        for s in batch {
            let end = s.cache.len + s.tokens.len();
            if end > c.context {
                return Err(ModelError::ContextFull(end, c.context).into());
            }
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::TokenOutOfRange(bad).into());
            }
            for a in s.steering {
                if a.layer >= c.n_layers || a.vector.len() != c.d_model {
                    return Err(ModelError::Shape(format!(
                        "steering vector of {} values for layer {}",
                        a.vector.len(),
                        a.layer
                    ))
                    .into());
                }
            }
            spans.push(total..total + s.tokens.len());
            total += s.tokens.len();
        }
        let score_floats = batch
            .iter()
            .map(|s| s.tokens.len() * c.n_heads * (s.cache.len + s.tokens.len()))
            .max()
            .unwrap_or(0);
        Ok(Plan {
            spans,
            total,
            score_floats,
        })
    }

    /// Checks that the step fits the device, and the capacity each cache must grow
    /// to (`None`: it has room). Every cache's growth is checked before any is
    /// replaced, so that a refused step leaves all of them as they were.
    fn check_room(
        &self,
        batch: &[GpuSeqInput<'_>],
        plan: &Plan,
    ) -> Result<Vec<Option<usize>>, GpuError> {
        let c = &self.config;
        let total = plan.total;
        if total > MAX_GROUPS as usize {
            return Err(GpuError::TooLarge {
                what: format!("a step of {total} tokens"),
                needed: total as u64,
                limit: u64::from(MAX_GROUPS),
            });
        }
        let mut grown = Vec::with_capacity(batch.len());
        for s in batch {
            grown.push(self.grown_capacity(s.cache, s.cache.len + s.tokens.len())?);
        }
        let largest = [
            total * (2 * c.ffn).max(c.q_dim() + 2 * c.kv_dim()),
            plan.score_floats,
            batch.iter().map(logit_count).sum::<usize>() * c.vocab,
        ];
        let limit = self.limits.max_storage_buffer_binding_size;
        if let Some(&n) = largest.iter().find(|&&n| (n * 4) as u64 > limit) {
            return Err(GpuError::TooLarge {
                what: format!("a step of {total} tokens"),
                needed: (n * 4) as u64,
                limit,
            });
        }
        Ok(grown)
    }

    /// Uploads the step's tokens, RoPE angles and steering vectors.
    fn upload_inputs(
        &self,
        rec: &mut Recorder<'_>,
        batch: &[GpuSeqInput<'_>],
        total: usize,
    ) -> Inputs {
        let tokens: Vec<u8> = batch
            .iter()
            .flat_map(|s| s.tokens.iter().flat_map(|t| t.to_le_bytes()))
            .collect();
        let tokens = rec.upload("tokens", &tokens);
        let pairs = self.config.rope_dims / 2;
        let angles = |inv_freq: &[f32]| {
            let mut angles = Vec::with_capacity(total * pairs * 2);
            for s in batch {
                for i in 0..s.tokens.len() {
                    let pos = (s.cache.len + i) as f32;
                    for &f in inv_freq {
                        let (sin, cos) = (pos * f).sin_cos();
                        angles.extend([cos, sin]);
                    }
                }
            }
            f32_bytes(&angles)
        };
        let rope = rec.upload("rope", &angles(&self.rope_inv_freq));
        let rope_local = self
            .rope_inv_freq_local
            .as_deref()
            .map(|f| rec.upload("rope_local", &angles(f)));
        let mut steer = Vec::new();
        let mut steer_at = Vec::new();
        for (si, s) in batch.iter().enumerate() {
            for a in s.steering {
                steer_at.push((a.layer, si, steer.len()));
                steer.extend_from_slice(&a.vector);
            }
        }
        let steer = rec.upload("steering", &f32_bytes(&steer));
        Inputs {
            tokens,
            rope,
            rope_local,
            steer,
            steer_at,
        }
    }

    /// Where the captures and the logits go in the read-back.
    fn reads(&self, batch: &[GpuSeqInput<'_>], plan: &Plan) -> Reads {
        let c = &self.config;
        let mut capture_at = Vec::new();
        let mut floats = 0usize;
        for (si, (s, span)) in batch.iter().zip(&plan.spans).enumerate() {
            for &l in s.capture.iter().filter(|&&l| l < c.n_layers) {
                capture_at.push((l, si, floats));
                floats += span.len() * c.d_model;
            }
        }
        let logits_at = floats;
        let mut logit_rows = Vec::new();
        for (s, span) in batch.iter().zip(&plan.spans) {
            logit_rows.extend(span.end - logit_count(s)..span.end);
        }
        floats += logit_rows.len() * c.vocab;
        Reads {
            capture_at,
            logits_at,
            logit_rows,
            floats,
        }
    }

    /// The step's activation buffers.
    fn activations(&self, rec: &mut Recorder<'_>, plan: &Plan) -> Activations {
        let c = &self.config;
        let (t, d, q, kv) = (plan.total, c.d_model, c.q_dim(), c.kv_dim());
        let proj = match c.recipe().post_norms {
            true => t * d,
            false => 1,
        };
        Activations {
            x: rec.scratch("x", t * d),
            xn: rec.scratch("xn", t * d),
            xq: rec.scratch("xq", t * d.max(q)),
            qkv: rec.scratch("qkv", t * (q + 2 * kv)),
            attn: rec.scratch("attn", t * q),
            proj: rec.scratch("proj", proj),
            gate_up: rec.scratch("gate_up", t * 2 * c.ffn),
            act: rec.scratch("act", t * c.ffn),
            scores: rec.scratch("scores", plan.score_floats),
        }
    }

    /// Block `l`'s attention, added to the residual stream: norm, the query, key and
    /// value projections (plus their biases; queries and keys rotated), each
    /// sequence's attention over its cache, and the output projection.
    fn attention(
        &self,
        rec: &mut Recorder<'_>,
        (l, b): (usize, &GpuBlock),
        batch: &[GpuSeqInput<'_>],
        plan: &Plan,
        bufs: &Activations,
        rope: &wgpu::Buffer,
    ) {
        let t = plan.total;
        let normed = (&bufs.xn, &bufs.xq);
        let mut quantized = self.rms_norm(rec, &bufs.x, &b.attn_norm, normed, t, &b.qkv);
        if self.fused_rope() {
            let qkv = (&bufs.qkv, Store::Rotated(rope));
            self.matmul(rec, &b.qkv, normed, &mut quantized, qkv, t);
        } else {
            self.matmul(
                rec,
                &b.qkv,
                normed,
                &mut quantized,
                (&bufs.qkv, Store::Set),
                t,
            );
            let c = &self.config;
            let width = c.q_dim() + 2 * c.kv_dim();
            if let Some(bias) = &b.qkv_bias {
                let add = (&self.pipes.add, Kernel::Bias);
                add::record(rec, add, (&bufs.qkv, 0), (bias, 0), t * width, width);
            }
            if let Some([qn, kn]) = &b.qk_norm {
                let (pipe, hd) = (&self.pipes.head_norm, c.head_dim);
                let rows = (t, width);
                let q_heads = (0, c.n_heads, hd);
                head_norm::record(rec, pipe, (&bufs.qkv, qn), rows, q_heads, c.rms_eps);
                let k_heads = (c.q_dim(), c.n_kv_heads, hd);
                head_norm::record(rec, pipe, (&bufs.qkv, kn), rows, k_heads, c.rms_eps);
            }
            rope::record(rec, &self.pipes.rope, c, (&bufs.qkv, rope), t);
        }
        // Attention rounds its output where the output projection reads 8-bit
        // blocks, and the kernel can.
        let mut rounded = attention::rounds_for(&self.config, b.wo.ty);
        for (si, (s, span)) in batch.iter().zip(&plan.spans).enumerate() {
            attention::record(
                rec,
                &self.pipes.attention,
                &self.config,
                l,
                (si, &*s.cache, span),
                rounded,
                [&bufs.qkv, &bufs.scores, &bufs.attn],
            );
        }
        let wo = std::slice::from_ref(&b.wo);
        let attn_q = if rounded { &bufs.attn } else { &bufs.xq };
        let post_norm = b.post_norms.as_ref().map(|[attn, _]| attn);
        let out = self.residual_target(bufs, post_norm);
        self.matmul(rec, wo, (&bufs.attn, attn_q), &mut rounded, out, t);
        self.add_normed(rec, bufs, post_norm, t);
    }

    /// Where a block's output projection stores: added to the residual stream as it
    /// stores, or into `proj` for its `post_norm` first.
    fn residual_target<'a>(
        &self,
        bufs: &'a Activations,
        post_norm: Option<&wgpu::Buffer>,
    ) -> (&'a wgpu::Buffer, Store<'a>) {
        match post_norm {
            Some(_) => (&bufs.proj, Store::Set),
            None => (&bufs.x, Store::Add),
        }
    }

    /// With a `post_norm`, the output in `proj` normed and added to the residual
    /// stream (what [`Self::residual_target`] left there).
    fn add_normed(
        &self,
        rec: &mut Recorder<'_>,
        bufs: &Activations,
        post_norm: Option<&wgpu::Buffer>,
        t: usize,
    ) {
        let Some(g) = post_norm else { return };
        let c = &self.config;
        let normed = [&bufs.proj, g, &bufs.xn, &bufs.xq];
        rms_norm::record(
            rec,
            &self.pipes.rms_norm,
            normed,
            t,
            (c.d_model, c.rms_eps),
            false,
        );
        let add = (&self.pipes.add, Kernel::Residual);
        let n = t * c.d_model;
        add::record(rec, add, (&bufs.x, 0), (&bufs.xn, 0), n, n);
    }

    /// A block's feed-forward, added to the residual stream: norm, the gate and up
    /// projections, the gated activation, the down projection, and the output norm
    /// where the family has one.
    fn feed_forward(&self, rec: &mut Recorder<'_>, b: &GpuBlock, bufs: &Activations, t: usize) {
        let c = &self.config;
        let normed = (&bufs.xn, &bufs.xq);
        let mut quantized = self.rms_norm(rec, &bufs.x, &b.ffn_norm, normed, t, &b.gate_up);
        let gu = (&bufs.gate_up, Store::Set);
        self.matmul(rec, &b.gate_up, normed, &mut quantized, gu, t);
        // The gated activation, rounded on the way where the down projection reads 8-bit blocks:
        // `act` is then its input either way.
        let round = b.down.ty.uses_q8_activations();
        let (gate_up, act) = (&bufs.gate_up, &bufs.act);
        let n_blocks = t * c.ffn / 32;
        quantize::record(
            rec,
            &self.pipes.quantize,
            (gate_up, act),
            Some((c.ffn, c.recipe().activation)),
            round,
            n_blocks,
        );
        let down = std::slice::from_ref(&b.down);
        let post_norm = b.post_norms.as_ref().map(|[_, ffn]| ffn);
        let out = self.residual_target(bufs, post_norm);
        self.matmul(rec, down, (act, act), &mut true, out, t);
        self.add_normed(rec, bufs, post_norm, t);
    }

    /// After block `l`: the steering vectors added to their sequences' rows of the
    /// residual stream `x`, then the captured rows copied out.
    fn steer_and_capture(
        &self,
        rec: &mut Recorder<'_>,
        l: usize,
        plan: &Plan,
        x: &wgpu::Buffer,
        inputs: &Inputs,
        reads: &Reads,
    ) {
        let d = self.config.d_model;
        for &(_, si, at) in inputs.steer_at.iter().filter(|e| e.0 == l) {
            let span = &plan.spans[si];
            let target = (x, span.start * d);
            add::record(
                rec,
                (&self.pipes.add, Kernel::Steer),
                target,
                (&inputs.steer, at),
                span.len() * d,
                d,
            );
        }
        for &(_, si, at) in reads.capture_at.iter().filter(|e| e.0 == l) {
            let span = &plan.spans[si];
            rec.copy(x, span.start * d, Dest::Readback(at), span.len() * d);
        }
    }

    /// The logits of the rows that want them: those rows of the residual stream,
    /// normed, times the output layer, copied to the read-back.
    fn logits(&self, rec: &mut Recorder<'_>, bufs: &Activations, reads: &Reads) {
        if reads.logit_rows.is_empty() {
            return;
        }
        let c = &self.config;
        let (r, d) = (reads.logit_rows.len(), c.d_model);
        let h = rec.scratch("h", r * d);
        let hn = rec.scratch("hn", r * d);
        let logits = rec.scratch("logits", r * c.vocab);
        for (i, &row) in reads.logit_rows.iter().enumerate() {
            rec.copy(&bufs.x, row * d, Dest::Buffer(&h, i * d), d);
        }
        let out = self.output.as_ref().unwrap_or(&self.embed);
        let out = std::slice::from_ref(out);
        let normed = (&hn, &bufs.xq);
        let mut quantized = self.rms_norm(rec, &h, &self.out_norm, normed, r, out);
        self.matmul(rec, out, normed, &mut quantized, (&logits, Store::Set), r);
        rec.copy(&logits, 0, Dest::Readback(reads.logits_at), r * c.vocab);
    }

    /// Submits the step and reads back its `floats` (and its profile when
    /// `profile`), handing each cache's bind groups through the recorder and
    /// keeping the arena for the next step.
    async fn submit(
        &self,
        rec: Recorder<'_>,
        batch: &mut [GpuSeqInput<'_>],
        floats: usize,
        profile: bool,
        scopes: ErrorScopes,
    ) -> Result<(Vec<f32>, Option<StepProfile>), GpuError> {
        let mut groups: Vec<_> = batch
            .iter_mut()
            .map(|s| std::mem::take(&mut s.cache.groups))
            .collect();
        let data = rec.finish(floats, &mut groups, profile).await;
        for (s, g) in batch.iter_mut().zip(groups) {
            s.cache.groups = g;
        }
        scopes.pop().await?;
        self.check_lost()?;
        let (data, arena, timed) = data?;
        if let Ok(mut a) = self.arena.lock() {
            *a = Some(arena);
        }
        Ok((data, timed))
    }

    /// `out` = `x` normalized (RMSNorm with gain `g`) for `rows` rows, and `out`
    /// rounded to 8 bits into `xq` as well when a matmul of `readers` takes rounded
    /// activations: returns whether it did (what [`Self::matmul`]'s `quantized`
    /// starts from).
    fn rms_norm(
        &self,
        rec: &mut Recorder<'_>,
        x: &wgpu::Buffer,
        g: &wgpu::Buffer,
        (out, xq): (&wgpu::Buffer, &wgpu::Buffer),
        rows: usize,
        readers: &[GpuTensor],
    ) -> bool {
        let c = &self.config;
        let round = readers.iter().any(|w| w.ty.uses_q8_activations());
        let bufs = [x, g, out, xq];
        rms_norm::record(
            rec,
            &self.pipes.rms_norm,
            bufs,
            rows,
            (c.d_model, c.rms_eps),
            round,
        );
        round
    }

    /// `out = W · input` (or `out += W · input`, the residual adds, when `store` is
    /// [`Store::Add`]; RoPE applied to the queries and keys when it is
    /// [`Store::Rotated`]) for `batch` vectors, where W is the rows of `ws` in turn (a
    /// row of `out` holds each one's results side by side); block formats read
    /// `input` rounded to 8 bits, into `xq` unless `quantized` says an earlier
    /// matmul (or the kernel that wrote `xq`) already did.
    fn matmul(
        &self,
        rec: &mut Recorder<'_>,
        ws: &[GpuTensor],
        (input, xq): (&wgpu::Buffer, &wgpu::Buffer),
        quantized: &mut bool,
        (out, store): (&wgpu::Buffer, Store<'_>),
        batch: usize,
    ) {
        let stride: usize = ws.iter().map(|w| w.rows).sum();
        let mut at = 0;
        for w in ws {
            let x = if w.ty.uses_q8_activations() {
                if !*quantized {
                    let n_blocks = batch * w.cols / 32;
                    let q = &self.pipes.quantize;
                    quantize::record(rec, q, (input, xq), None, true, n_blocks);
                    *quantized = true;
                }
                xq
            } else {
                input
            };
            let target = Target {
                out,
                store,
                stride,
                at,
            };
            matmul::record(rec, &self.pipes.matmul, &self.config, w, x, target, batch);
            at += w.rows;
        }
    }
}

/// How many of a sequence's new positions want logits (a sequence without new
/// tokens has no last position).
fn logit_count(s: &GpuSeqInput<'_>) -> usize {
    match s.logits {
        Logits::None => 0,
        Logits::Last => usize::from(!s.tokens.is_empty()),
        Logits::All => s.tokens.len(),
    }
}
