//! How a matmul runs: each matrix's rows are cut into tasks, the tasks of all matrices
//! go to the thread team together, and each task calls the best kernel this CPU has
//! for its format, or the format's portable dot.

use super::activations::QuantizedActivations;
use super::format;
use super::packed::{PANEL, PackedMatrix};
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
use super::wasm;
use super::{GgmlType, MatJob};
#[cfg(target_arch = "x86_64")]
use super::{activations::GROUP, x86};
use crate::cpu::isa::Isa;

/// About this many weight bytes per task: enough work to amortise scheduling, small
/// enough that two cores balance even on the K and V projections of a decode step.
const TASK_BYTES: usize = 16 * 1024;

/// A job's output, shared by the tasks that fill it in parallel.
#[derive(Debug, Clone, Copy)]
struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a `SharedOut` stands for an `&'a mut [f32]` (which is Send and Sync) lent to
// one parallel region; the only access through it is `write`, whose contract keeps
// the threads on disjoint entries.
unsafe impl Send for SharedOut<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    fn new(out: &'a mut [f32]) -> Self {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Stores `v` at entry `i` (bounds-checked).
    ///
    /// # Safety
    /// No other thread may access entry `i` while the borrow this came from lasts.
    unsafe fn write(self, i: usize, v: f32) {
        assert!(i < self.len, "output index {i} out of {}", self.len);
        // SAFETY: `i < len` keeps the store inside the borrowed slice, and the caller
        // guarantees that no other thread touches entry `i`.
        unsafe { self.ptr.add(i).write(v) }
    }

    /// Stores `v` at entries `i .. i + 8` (bounds-checked): a panel's eight rows of
    /// one vector, which lie side by side in the output.
    ///
    /// # Safety
    /// No other thread may access those entries while the borrow this came from lasts.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    unsafe fn write_lanes(self, i: usize, v: &[f32; 8]) {
        assert!(
            i + 8 <= self.len,
            "output entries {i}..+8 out of {}",
            self.len
        );
        // SAFETY: `i + 8 <= len` keeps the stores inside the borrowed slice, `v` is a
        // separate array (no overlap), and the caller guarantees no other thread
        // touches these entries.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), 8) }
    }
}

/// One job as its tasks see it.
#[derive(Debug, Clone, Copy)]
struct Part<'a> {
    ty: GgmlType,
    weights: &'a [u8],
    /// Read by the x86 kernels only (there are no packed matrices elsewhere).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    packed: Option<&'a PackedMatrix>,
    n_rows: usize,
    /// Bytes per row.
    rb: usize,
    /// Rows per task.
    per: usize,
    /// Index of the job's first task.
    first: usize,
    out: SharedOut<'a>,
}

/// Runs validated jobs: each job's rows are cut into tasks of about [`TASK_BYTES`],
/// and the tasks of all jobs are spread over the cores together.
pub(crate) fn run_jobs(
    jobs: &mut [MatJob<'_>],
    n_cols: usize,
    batch: usize,
    xs: &[f32],
    qx: &QuantizedActivations,
) {
    if batch == 0 {
        return;
    }
    let isa = Isa::detect();
    let mut n_tasks = 0;
    let parts: Vec<Part<'_>> = jobs
        .iter_mut()
        .map(|j| {
            let rb = j.ty.row_bytes(n_cols).expect("validated shape");
            // Whole panels per task when packed, of either width (8 rows, or 16 for
            // AVX-512).
            let per = (TASK_BYTES / rb.max(1)).clamp(2 * PANEL, 4096) / (2 * PANEL) * (2 * PANEL);
            let first = n_tasks;
            n_tasks += j.n_rows.div_ceil(per);
            Part {
                ty: j.ty,
                weights: j.weights,
                packed: j.packed,
                n_rows: j.n_rows,
                rb,
                per,
                first,
                out: SharedOut::new(j.out),
            }
        })
        .collect();
    let task = |t: usize| {
        // The job whose tasks hold `t`: the last one starting at or before it.
        let p = parts
            .iter()
            .rev()
            .find(|p| p.first <= t)
            .expect("task 0 belongs to the first job");
        let r0 = (t - p.first) * p.per;
        let rows = r0..(r0 + p.per).min(p.n_rows);
        let (out, n_rows) = (p.out, p.n_rows);
        let put = |v: usize, r: usize, val: f32| {
            // SAFETY: `r` is one of this task's rows, and the tasks partition each
            // job's rows, so entry (v, r) is written by this task alone.
            unsafe { out.write(v * n_rows + r, val) }
        };
        run_task(isa, p, rows, n_cols, xs, qx, put);
    };
    crate::cpu::team::run(n_tasks, task);
}

/// A kernel of one weight row against `V` consecutive vectors of a batch (those from
/// `g`), for [`rows_by_four`].
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(crate) trait RowKernel {
    fn row<const V: usize>(&self, row: &[u8], qx: &QuantizedActivations, g: usize) -> [f32; V];
}

/// Rows `rows` against every vector of `qx`, up to four vectors per pass over a row,
/// so that each of a row's blocks is unpacked once per four vectors rather than once
/// per vector; `put(v, r, value)` takes each result.
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(crate) fn rows_by_four(
    kernel: &impl RowKernel,
    weights: &[u8],
    rb: usize,
    rows: std::ops::Range<usize>,
    qx: &QuantizedActivations,
    put: &mut impl FnMut(usize, usize, f32),
) {
    for r in rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for g in (0..qx.count).step_by(4) {
            let mut emit = |vals: &[f32]| {
                for (k, &val) in vals.iter().enumerate() {
                    put(g + k, r, val);
                }
            };
            match qx.count - g {
                1 => emit(&kernel.row::<1>(row, qx, g)),
                2 => emit(&kernel.row::<2>(row, qx, g)),
                3 => emit(&kernel.row::<3>(row, qx, g)),
                _ => emit(&kernel.row::<4>(row, qx, g)),
            }
        }
    }
}

/// Rows `rows` of one matrix against every vector: batched tile kernels where the
/// format has them, else one dot per (row, vector).
fn run_task(
    isa: Isa,
    p: &Part<'_>,
    rows: std::ops::Range<usize>,
    n_cols: usize,
    xs: &[f32],
    qx: &QuantizedActivations,
    mut put: impl FnMut(usize, usize, f32),
) {
    let (ty, weights, rb) = (p.ty, p.weights, p.rb);
    let batch = if ty.uses_q8_activations() {
        qx.count
    } else {
        xs.len() / n_cols
    };
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2(t) = isa {
        if let Some(pm) = p.packed {
            let (out, n_rows) = (p.out, p.n_rows);
            let mut put_lanes = |v: usize, r0: usize, lanes: &[f32; 8]| {
                // SAFETY: a packed job's tasks hold whole panels, so rows r0..r0 + 8
                // are this task's alone (the tasks partition each job's rows).
                unsafe { out.write_lanes(v * n_rows + r0, lanes) }
            };
            return x86::packed::packed_rows(t, pm, rows, qx, &mut put_lanes);
        }
        if x86::tile::matmul_rows(t, ty, weights, rb, rows.clone(), qx, &mut put) {
            return;
        }
        if x86::k_quants::one_row_rows(t, ty, weights, rb, rows.clone(), qx, &mut put) {
            return;
        }
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if wasm::matmul_rows(ty, weights, rb, rows.clone(), qx, &mut put) {
        return;
    }
    let kernels = format::kernels(ty).expect("a supported type");
    for r in rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for v in 0..batch {
            let val = if ty.uses_q8_activations() {
                dot_q8_dispatch(isa, ty, row, qx, v)
            } else {
                (kernels.dot_f32)(row, &xs[v * n_cols..(v + 1) * n_cols])
            };
            put(v, r, val);
        }
    }
}

/// One weight row against vector `v` of `qx`; `row` must hold exactly `qx.nb` blocks'
/// worth of values.
#[inline]
pub(crate) fn dot_q8_dispatch(
    isa: Isa,
    ty: GgmlType,
    row: &[u8],
    qx: &QuantizedActivations,
    v: usize,
) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2(t) => match ty {
            _ if x86::tile::TILED.contains(&ty) => {
                let x = x86::Xs {
                    blocks: qx.vector(v),
                    sums: qx.group_sums(v),
                    lane: v % GROUP,
                    nb: qx.nb,
                    flipped: &[],
                };
                x86::tile::tile::<1, 1>(t, ty, [row], x)[0][0]
            }
            GgmlType::IQ4_NL => x86::iq4::dot_iq4_nl(t, row, qx.vector(v)),
            GgmlType::IQ4_XS => x86::iq4::dot_iq4_xs(t, row, qx.vector(v)),
            GgmlType::Q2_K => x86::k_quants::dot_q2_k(t, row, qx.vector(v)),
            GgmlType::Q3_K => x86::k_quants::dot_q3_k(t, row, qx.vector(v)),
            GgmlType::Q4_K => x86::k_quants::dot_q4_k(t, row, qx.vector(v)),
            GgmlType::Q5_K => x86::k_quants::dot_q5_k(t, row, qx.vector(v)),
            GgmlType::Q6_K => x86::k_quants::dot_q6_k(t, row, qx.vector(v)),
            _ => portable_dot(ty, row, qx.vector(v)),
        },
        Isa::Portable => {
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            if let Some(d) = wasm::dot(ty, row, qx.vector(v)) {
                return d;
            }
            portable_dot(ty, row, qx.vector(v))
        }
    }
}

/// The format's portable dot of one row with 8-bit activation blocks.
fn portable_dot(ty: GgmlType, row: &[u8], x: &[super::activations::BlockQ8]) -> f32 {
    (format::kernels(ty).expect("a supported type").dot_q8)(row, x)
}
