//! Adding a vector, repeated, to a range of a buffer: the steering adds and the
//! projections' biases (`shaders/add.wgsl`).

use crate::webgpu::arena::whole;
use crate::webgpu::profile::Kernel;
use crate::webgpu::recorder::Recorder;

use super::{compile, groups_1d, params, source};

pub(super) const SOURCE: &str = include_str!("../shaders/add.wgsl");

params! {
    /// `X[x_off + i] += Y[y_off + i % period]` for `i < n`.
    struct AddParams {
        /// Values added.
        n: u32,
        /// Where they go in `X`.
        x_off: u32,
        /// Where the added vector starts in `Y`.
        y_off: u32,
        /// The added vector's length.
        period: u32,
    }
}

pub(super) fn pipeline(device: &wgpu::Device) -> wgpu::ComputePipeline {
    compile(device, "add", &source::<AddParams>("", &[], SOURCE))
}

/// Adds `y` from float `y_off` on, `period` values repeated, to the `n` floats of
/// `x` from `x_off` on; `what` names it in profiles.
pub(crate) fn record(
    rec: &mut Recorder<'_>,
    (pipe, what): (&wgpu::ComputePipeline, Kernel),
    (x, x_off): (&wgpu::Buffer, usize),
    (y, y_off): (&wgpu::Buffer, usize),
    n: usize,
    period: usize,
) {
    let p = AddParams {
        n: n as u32,
        x_off: x_off as u32,
        y_off: y_off as u32,
        period: period as u32,
    };
    let bindings = [whole(x), whole(y)];
    rec.dispatch(what, pipe, bindings, &p, groups_1d(n as u32));
}
