//! librdmacm's device contexts (`rdma_get_devices(3)`).

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, Result};
use crate::{ffi, Context};

/// The list from `rdma_get_devices`, freed (`rdma_free_devices(3)`) when the
/// last context borrowed from it is gone.
struct DeviceList {
    list: NonNull<*mut ffi::ibv_context>,
}

// SAFETY: the list is only freed, once, in Drop; librdmacm locks its own
// device bookkeeping.
unsafe impl Send for DeviceList {}
// SAFETY: as above.
unsafe impl Sync for DeviceList {}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list from rdma_get_devices, freed once; every context
        // borrowed from it holds an Arc to this value, so none is left.
        unsafe { ffi::rdma_free_devices(self.list.as_ptr()) };
    }
}

/// The device contexts librdmacm uses (`rdma_get_devices(3)`): the same
/// `ibv_context`s as [`crate::cm::CmId::context`], so PDs, CQs and QPs made on
/// them can be handed to [`crate::cm::CmId::create_qp`] and
/// [`crate::cm::create_ep`]. They are borrowed: never closed by this crate;
/// each keeps the list alive.
///
/// # Errors
/// [`crate::Error::Verb`] naming `rdma_get_devices` (`ENODEV` without RDMA
/// devices) or `ibv_query_device`.
pub fn get_devices() -> Result<Vec<Context>> {
    let mut n: std::ffi::c_int = 0;
    let list = call_ptr(
        "rdma_get_devices",
        || "".into(),
        || {
            // SAFETY: valid out-pointer.
            unsafe { ffi::rdma_get_devices(&mut n) }
        },
    )?;
    let keep = Arc::new(DeviceList { list });
    let mut out = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` entries followed by NULL.
        let Some(ctx) = NonNull::new(unsafe { *list.as_ptr().add(i) }) else {
            break;
        };
        let keep: Arc<dyn Send + Sync> = Arc::clone(&keep) as Arc<dyn Send + Sync>;
        // SAFETY: librdmacm keeps the context open while the list is not freed.
        out.push(unsafe { Context::borrowed(ctx, keep) }?);
    }
    Ok(out)
}
