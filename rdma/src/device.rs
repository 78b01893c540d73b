//! RDMA devices: the list libibverbs finds, and their identity.
//!
//! See `ibv_get_device_list(3)`, `ibv_get_device_name(3)`,
//! `ibv_get_device_guid(3)`.

use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{call_ptr, Error, Result};
use crate::ffi;
use crate::macros::c_enum;
#[cfg(doc)]
use crate::Context;

/// The array `ibv_get_device_list` returned; freed when the last [`Device`]
/// (or [`Context`] opened from one) that points into it is gone.
pub(crate) struct DeviceListInner {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array of device pointers after
// ibv_get_device_list returns; ibv_free_device_list may run on any thread.
unsafe impl Send for DeviceListInner {}
// SAFETY: nothing mutates the list; the device structs are read-only.
unsafe impl Sync for DeviceListInner {}

impl Drop for DeviceListInner {
    fn drop(&mut self) {
        // SAFETY: `list` came from ibv_get_device_list and is freed once, here.
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// Lists the RDMA devices of this machine (`ibv_get_device_list(3)`).
///
/// # Errors
/// [`Error::LibraryMissing`] when libibverbs cannot be opened (the `dlopen`
/// feature). `ibv_get_device_list` fails with `ENOSYS` when the kernel has no
/// RDMA support (no `ib_uverbs`), `ENOMEM` when out of memory.
pub fn devices() -> Result<Vec<Device>> {
    crate::error::load_ibverbs()?;
    let mut n: std::ffi::c_int = 0;
    let list = call_ptr(
        "ibv_get_device_list",
        || "".into(),
        || {
            // SAFETY: `n` is a valid out-pointer; the returned array is owned
            // by us.
            unsafe { ffi::ibv_get_device_list(&mut n) }
        },
    )
    .map_err(|e| match e.errno() {
        Some(errno @ libc::ENOSYS) => Error::verb_errno(
            "ibv_get_device_list",
            "no RDMA support in this kernel; is ib_uverbs loaded?",
            errno,
        ),
        _ => e,
    })?;
    let len = usize::try_from(n).unwrap_or(0);
    let inner = Arc::new(DeviceListInner { list, len });
    Ok((0..inner.len)
        .filter_map(|i| {
            // SAFETY: the array has `len` valid entries (NULL-terminated after).
            let dev = unsafe { *inner.list.as_ptr().add(i) };
            NonNull::new(dev).map(|dev| Device {
                list: Arc::clone(&inner),
                dev,
            })
        })
        .collect())
}

/// The names of the devices present, for error messages.
pub(crate) fn device_names(devices: &[Device]) -> String {
    if devices.is_empty() {
        "none".to_string()
    } else {
        devices
            .iter()
            .map(Device::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Finds a device by its kernel name (`rxe0`, `mlx5_0`, ...).
///
/// # Errors
/// [`Error::DeviceNotFound`] (listing the devices that exist), or the error of
/// [`devices`].
pub fn device_by_name(name: &str) -> Result<Device> {
    let all = devices()?;
    let available = device_names(&all);
    all.into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| Error::DeviceNotFound {
            name: name.to_string(),
            available,
        })
}

/// An RDMA device found by [`devices`]. Open it with [`Device::open`].
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// for dev in rdma::devices()? {
///     println!("{} {}", dev.name(), dev.guid());
///     let ctx = dev.open()?;
///     # let _ = ctx;
/// }
/// # Ok(()) }
/// ```
pub struct Device {
    // Keeps the array (and so the device struct) alive.
    list: Arc<DeviceListInner>,
    dev: NonNull<ffi::ibv_device>,
}

// SAFETY: `ibv_device` is read-only after listing; the list is kept alive.
unsafe impl Send for Device {}
// SAFETY: as above; all accessors only read.
unsafe impl Sync for Device {}

impl Device {
    /// The kernel name of the device (`ibv_get_device_name(3)`).
    pub fn name(&self) -> &str {
        // SAFETY: `dev` is valid while `list` lives; `name` is a NUL-terminated
        // array inside the device struct.
        let name = unsafe { CStr::from_ptr((*self.dev.as_ptr()).name.as_ptr()) };
        name.to_str().unwrap_or("<non-UTF-8 device name>")
    }

    /// The node GUID (`ibv_get_device_guid(3)`), in host byte order.
    pub fn guid(&self) -> Guid {
        // SAFETY: `dev` is a valid device of a live list.
        Guid::from_be(unsafe { ffi::ibv_get_device_guid(self.dev.as_ptr()) })
    }

    /// The node type (CA, switch, router, RNIC, ...).
    pub fn node_type(&self) -> NodeType {
        // SAFETY: reads a plain field of a valid device.
        NodeType::from_raw(unsafe { (*self.dev.as_ptr()).node_type })
    }

    /// The transport (InfiniBand, iWARP, ...). RoCE devices report InfiniBand;
    /// their ports report an Ethernet link layer.
    pub fn transport_type(&self) -> TransportType {
        // SAFETY: reads a plain field of a valid device.
        TransportType::from_raw(unsafe { (*self.dev.as_ptr()).transport_type })
    }

    /// The uverbs device path (`/sys/class/infiniband_verbs/uverbsN`).
    pub fn ibdev_path(&self) -> &str {
        // SAFETY: NUL-terminated array inside a valid device struct.
        let p = unsafe { CStr::from_ptr((*self.dev.as_ptr()).ibdev_path.as_ptr()) };
        p.to_str().unwrap_or("")
    }

    pub(crate) fn as_raw(&self) -> *mut ffi::ibv_device {
        self.dev.as_ptr()
    }

    pub(crate) fn list(&self) -> &Arc<DeviceListInner> {
        &self.list
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name())
            .field("guid", &self.guid())
            .field("node_type", &self.node_type())
            .field("transport_type", &self.transport_type())
            .finish()
    }
}

/// A 64-bit GUID (node, port or system image), in host byte order.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let dev = rdma::device_by_name("rxe0")?;
/// let guid: rdma::Guid = dev.guid();
/// println!("{guid}"); // as ibv_devinfo prints it: 5054:00ff:fe12:3456
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Guid(pub u64);

impl Guid {
    /// From the big-endian (network order) value the verbs return.
    pub fn from_be(raw: u64) -> Self {
        Guid(u64::from_be(raw))
    }

    /// The big-endian (network order) value the verbs take.
    pub fn to_be(self) -> u64 {
        self.0.to_be()
    }
}

impl fmt::Display for Guid {
    /// `xxxx:xxxx:xxxx:xxxx`, as `ibv_devinfo` and sysfs print GUIDs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:04x}:{:04x}:{:04x}:{:04x}",
            (v >> 48) & 0xffff,
            (v >> 32) & 0xffff,
            (v >> 16) & 0xffff,
            v & 0xffff
        )
    }
}

impl fmt::Debug for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guid({self})")
    }
}

c_enum! {
    /// `enum ibv_node_type`.
    pub enum NodeType: i32 {
        /// Channel adapter (HCA, RoCE NIC).
        Ca = ffi::IBV_NODE_CA,
        /// InfiniBand switch.
        Switch = ffi::IBV_NODE_SWITCH,
        /// Router.
        Router = ffi::IBV_NODE_ROUTER,
        /// iWARP RDMA NIC.
        Rnic = ffi::IBV_NODE_RNIC,
        /// Cisco usNIC.
        Usnic = ffi::IBV_NODE_USNIC,
        /// Cisco usNIC over UDP.
        UsnicUdp = ffi::IBV_NODE_USNIC_UDP,
        /// Unspecified.
        Unspecified = ffi::IBV_NODE_UNSPECIFIED,
    }
}

c_enum! {
    /// `enum ibv_transport_type`.
    pub enum TransportType: i32 {
        /// InfiniBand, also RoCE.
        InfiniBand = ffi::IBV_TRANSPORT_IB,
        /// iWARP.
        Iwarp = ffi::IBV_TRANSPORT_IWARP,
        /// usNIC.
        Usnic = ffi::IBV_TRANSPORT_USNIC,
        /// usNIC over UDP.
        UsnicUdp = ffi::IBV_TRANSPORT_USNIC_UDP,
        /// Unspecified.
        Unspecified = ffi::IBV_TRANSPORT_UNSPECIFIED,
    }
}

impl fmt::Display for NodeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The strings of ibv_node_type_str(3).
        let s = match self {
            NodeType::Ca => "InfiniBand channel adapter",
            NodeType::Switch => "InfiniBand switch",
            NodeType::Router => "InfiniBand router",
            NodeType::Rnic => "iWARP NIC",
            NodeType::Usnic => "usNIC",
            NodeType::UsnicUdp => "usNIC UDP",
            NodeType::Unspecified => "unspecified",
            NodeType::Unknown(_) => "unknown",
        };
        f.write_str(s)
    }
}

impl fmt::Display for TransportType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportType::InfiniBand => f.write_str("InfiniBand"),
            TransportType::Iwarp => f.write_str("iWARP"),
            TransportType::Usnic => f.write_str("usNIC"),
            TransportType::UsnicUdp => f.write_str("usNIC UDP"),
            TransportType::Unspecified => f.write_str("unspecified"),
            TransportType::Unknown(v) => write!(f, "unknown ({v})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_formats_like_ibv_devinfo() {
        let g = Guid(0x0002_c903_0010_abcd);
        assert_eq!(g.to_string(), "0002:c903:0010:abcd");
        assert_eq!(Guid::from_be(g.to_be()), g);
    }

    #[test]
    fn unknown_enum_values_are_preserved() {
        assert_eq!(NodeType::from_raw(1), NodeType::Ca);
        assert_eq!(NodeType::from_raw(-1), NodeType::Unknown(-1));
        assert_eq!(NodeType::from_raw(99).to_raw(), 99);
        assert_eq!(TransportType::from_raw(1), TransportType::Iwarp);
        assert_eq!(TransportType::from_raw(42), TransportType::Unknown(42));
    }
}
