//! Finding an adapter, opening a device on it, and what every part of the backend
//! needs of the device: its limits, its errors, whether it was lost, reading back.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use super::error::GpuError;

/// How the backend's storage buffers are used: bound to kernels, copied from and to.
pub(crate) const STORAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// Finds an adapter: the best hardware one (discrete, then integrated, then virtual),
/// else a software one (lavapipe, SwiftShader) if `allow_software`. Report its
/// `get_info()` (name, backend, device type) so a slow software fallback is visible.
pub async fn pick_adapter(allow_software: bool) -> Result<wgpu::Adapter, GpuError> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let rank = |t: wgpu::DeviceType| match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let usable =
        |a: &wgpu::Adapter| allow_software || a.get_info().device_type != wgpu::DeviceType::Cpu;
    let mut adapters: Vec<wgpu::Adapter> = instance
        .enumerate_adapters(wgpu::Backends::all())
        .await
        .into_iter()
        .filter(usable)
        .collect();
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    if let Some(a) = adapters.into_iter().next() {
        return Ok(a);
    }
    // The browser lists no adapters; it hands out one on request.
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    match instance.request_adapter(&options).await {
        Ok(a) if usable(&a) => Ok(a),
        _ => Err(GpuError::NoAdapter { allow_software }),
    }
}

/// Opens a device on `adapter`, watching for its loss.
pub(crate) async fn open(
    adapter: &wgpu::Adapter,
) -> Result<(wgpu::Device, wgpu::Queue, Lost), GpuError> {
    let have = adapter.limits();
    // The WebGPU defaults, except as large buffers as the adapter can bind: the
    // embedding of a real model is hundreds of MiB.
    let required_limits = wgpu::Limits {
        max_storage_buffer_binding_size: have.max_storage_buffer_binding_size,
        max_buffer_size: have.max_buffer_size,
        ..wgpu::Limits::default()
    };
    let (device, queue) = adapter
        .request_device(&wgpu::DeviceDescriptor {
            label: Some("acs-llama"),
            // Only for profiling (GpuModel::profile); a step without it is the same.
            required_features: adapter.features() & wgpu::Features::TIMESTAMP_QUERY,
            required_limits,
            ..Default::default()
        })
        .await
        .map_err(|e| GpuError::RequestDevice(e.to_string()))?;
    let lost = Lost::watch(&device);
    Ok((device, queue, lost))
}

/// Why the device was lost, once it is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lost(Arc<Mutex<Option<String>>>);

impl Lost {
    /// Records why `device` is lost when it is.
    fn watch(device: &wgpu::Device) -> Self {
        let lost = Lost::default();
        let why = Arc::clone(&lost.0);
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = why.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        lost
    }

    /// Why the device was lost, if it was.
    pub(crate) fn why(&self) -> Option<String> {
        match self.0.lock() {
            Ok(l) => l.clone(),
            Err(_) => Some("lost-device state poisoned".into()),
        }
    }

    /// An error if the device was lost.
    pub(crate) fn check(&self) -> Result<(), GpuError> {
        match self.0.lock() {
            Ok(l) => match &*l {
                Some(why) => Err(GpuError::DeviceLost(why.clone())),
                None => Ok(()),
            },
            Err(_) => Err(GpuError::DeviceLost("lost-device state poisoned".into())),
        }
    }
}

/// The largest buffer a kernel can bind.
pub(crate) fn bind_limit(limits: &wgpu::Limits) -> u64 {
    limits
        .max_storage_buffer_binding_size
        .min(limits.max_buffer_size)
}

/// Maps `buf` for reading: natively by waiting on the device, in the browser by
/// awaiting the map callback.
pub(crate) async fn map_read(device: &wgpu::Device, buf: &wgpu::Buffer) -> Result<(), GpuError> {
    #[derive(Default)]
    struct State {
        done: Option<Result<(), wgpu::BufferAsyncError>>,
        waker: Option<Waker>,
    }
    let state = Arc::new(Mutex::new(State::default()));
    let cb_state = Arc::clone(&state);
    buf.map_async(wgpu::MapMode::Read, .., move |r| {
        if let Ok(mut s) = cb_state.lock() {
            s.done = Some(r);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    });
    // On the web this returns at once and the callback comes from the event loop.
    device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| GpuError::DeviceLost(e.to_string()))?;
    std::future::poll_fn(|cx| match state.lock() {
        Ok(mut s) => match s.done.take() {
            Some(r) => Poll::Ready(r.map_err(|e| GpuError::Readback(e.to_string()))),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        },
        Err(_) => Poll::Ready(Err(GpuError::Readback("map state poisoned".into()))),
    })
    .await
}

/// Error scopes around a load or a step, so that an out-of-memory or a rejected
/// command becomes a [`GpuError`] instead of wgpu's default panic.
///
/// The fields drop in declaration order, which pops the scopes innermost first when a
/// step returns early.
pub(crate) struct ErrorScopes {
    internal: wgpu::ErrorScopeGuard,
    validation: wgpu::ErrorScopeGuard,
    oom: wgpu::ErrorScopeGuard,
}

impl std::fmt::Debug for ErrorScopes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErrorScopes")
    }
}

impl ErrorScopes {
    pub(crate) fn push(device: &wgpu::Device) -> Self {
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        ErrorScopes {
            internal,
            validation,
            oom,
        }
    }

    /// Pops the scopes (innermost first) and reports the first error caught.
    pub(crate) fn pop(self) -> impl Future<Output = Result<(), GpuError>> {
        let internal = self.internal.pop();
        let validation = self.validation.pop();
        let oom = self.oom.pop();
        async move {
            if let Some(e) = oom.await {
                return Err(GpuError::OutOfMemory(e.to_string()));
            }
            if let Some(e) = validation.await {
                return Err(GpuError::Validation(e.to_string()));
            }
            if let Some(e) = internal.await {
                return Err(GpuError::Validation(e.to_string()));
            }
            Ok(())
        }
    }
}
