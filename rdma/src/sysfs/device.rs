//! Devices: `/sys/class/infiniband/<device>/`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::attr::{numbered_entries, parse_guid, parse_numbered, read, read_optional, read_parsed};
use super::cache::Lazy;
use super::port::{EndPort, PortInner};
use crate::device::{Guid, NodeType, TransportType};
use crate::error::{Error, Result};
use crate::Context;

struct DeviceInner {
    name: String,
    dir: PathBuf,
    node_type: Lazy<NodeType>,
    node_guid: Lazy<Guid>,
    sys_image_guid: Lazy<Guid>,
    node_desc: Lazy<String>,
    fw_ver: Lazy<Option<String>>,
    hw_rev: Lazy<Option<String>>,
    hca_type: Lazy<Option<String>>,
    board_id: Lazy<Option<String>>,
    // The set of ports of a device never changes while it exists, so
    // `refresh` keeps this list and drops the caches of the ports in it
    // instead: handles given out before stay connected to the invalidation.
    ports: Lazy<Arc<[Arc<PortInner>]>>,
}

/// An RDMA device as `/sys/class/infiniband/<name>/` describes it, found
/// without opening it (see [`super::Sysfs`]).
///
/// Every property is read on first use and cached; clones share the cache and
/// are cheap (an `Arc`). [`RdmaDevice::refresh`] drops the cache.
/// Driver-specific files that a device may lack (`fw_ver`, `hw_rev`,
/// `hca_type`, `board_id`) are `Ok(None)` when absent or empty.
#[derive(Clone)]
pub struct RdmaDevice {
    inner: Arc<DeviceInner>,
}

/// The transport libibverbs derives from a node type.
fn transport_of(node_type: NodeType) -> TransportType {
    match node_type {
        NodeType::Ca | NodeType::Switch | NodeType::Router => TransportType::InfiniBand,
        NodeType::Rnic => TransportType::Iwarp,
        NodeType::Usnic => TransportType::Usnic,
        NodeType::UsnicUdp => TransportType::UsnicUdp,
        NodeType::Unspecified => TransportType::Unspecified,
        NodeType::Unknown(_) => TransportType::Unknown(-1),
    }
}

impl RdmaDevice {
    pub(crate) fn new(name: &str, dir: PathBuf) -> Self {
        RdmaDevice {
            inner: Arc::new(DeviceInner {
                name: name.to_string(),
                dir,
                node_type: Lazy::new(),
                node_guid: Lazy::new(),
                sys_image_guid: Lazy::new(),
                node_desc: Lazy::new(),
                fw_ver: Lazy::new(),
                hw_rev: Lazy::new(),
                hca_type: Lazy::new(),
                board_id: Lazy::new(),
                ports: Lazy::new(),
            }),
        }
    }

    /// The kernel name (`mlx5_0`, `rxe0`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device's sysfs directory.
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    fn file(&self, name: &str) -> PathBuf {
        self.inner.dir.join(name)
    }

    /// The node type (`node_type`, e.g. `1: CA`, `2: switch`, `4: RNIC`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it is missing or malformed (as
    /// for every property below).
    pub fn node_type(&self) -> Result<NodeType> {
        self.inner.node_type.get_or_read(|| {
            read_parsed(&self.file("node_type"), "\"<number>: <name>\"", |t| {
                parse_numbered::<i32>(t).map(|(v, _)| NodeType::from_raw(v))
            })
        })
    }

    /// The transport, derived from the node type as libibverbs does: CAs,
    /// switches and routers are InfiniBand (RoCE too), RNICs are iWARP.
    ///
    /// # Errors
    /// As [`RdmaDevice::node_type`].
    pub fn transport_type(&self) -> Result<TransportType> {
        self.node_type().map(transport_of)
    }

    fn guid(&self, cell: &Lazy<Guid>, name: &str) -> Result<Guid> {
        cell.get_or_read(|| {
            read_parsed(
                &self.file(name),
                "a GUID like 0002:c903:0010:abcd",
                parse_guid,
            )
        })
    }

    /// The node GUID (`node_guid`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn node_guid(&self) -> Result<Guid> {
        self.guid(&self.inner.node_guid, "node_guid")
    }

    /// The system image GUID (`sys_image_guid`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn sys_image_guid(&self) -> Result<Guid> {
        self.guid(&self.inner.sys_image_guid, "sys_image_guid")
    }

    /// The node description (`node_desc`), e.g. `host1 mlx5_0`.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn node_desc(&self) -> Result<String> {
        self.inner
            .node_desc
            .get_or_read(|| read(&self.file("node_desc")))
    }

    fn optional(&self, cell: &Lazy<Option<String>>, name: &str) -> Result<Option<String>> {
        cell.get_or_read(|| {
            Ok(read_optional(&self.file(name))?
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty()))
        })
    }

    /// The firmware version (`fw_ver`); `None` when the driver reports none
    /// (the file is empty for soft-RoCE and soft-iWARP).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it exists but cannot be read.
    pub fn fw_ver(&self) -> Result<Option<String>> {
        self.optional(&self.inner.fw_ver, "fw_ver")
    }

    /// The hardware revision (`hw_rev`, driver-specific); `None` when absent.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it exists but cannot be read.
    pub fn hw_rev(&self) -> Result<Option<String>> {
        self.optional(&self.inner.hw_rev, "hw_rev")
    }

    /// The HCA type (`hca_type`, driver-specific, e.g. `MT4123`); `None`
    /// when absent.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it exists but cannot be read.
    pub fn hca_type(&self) -> Result<Option<String>> {
        self.optional(&self.inner.hca_type, "hca_type")
    }

    /// The board ID (`board_id`, driver-specific, e.g. `MT_0000000223`);
    /// `None` when absent.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it exists but cannot be read.
    pub fn board_id(&self) -> Result<Option<String>> {
        self.optional(&self.inner.board_id, "board_id")
    }

    fn port_inners(&self) -> Result<Arc<[Arc<PortInner>]>> {
        self.inner.ports.get_or_read(|| {
            let dir = self.file("ports");
            let numbers = numbered_entries(&dir)?.ok_or_else(|| {
                super::attr::unreadable(&dir, std::io::Error::from_raw_os_error(libc::ENOENT))
            })?;
            Ok(numbers
                .into_iter()
                .map(|n| Arc::new(PortInner::new(&self.inner.name, &self.inner.dir, n)))
                .collect())
        })
    }

    /// The end ports in port order: `[0]` for a switch, `[1, 2, ...]` for a
    /// channel adapter.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming `ports/` when it cannot be listed.
    pub fn end_ports(&self) -> Result<Vec<EndPort>> {
        Ok(self
            .port_inners()?
            .iter()
            .map(|p| EndPort::new(self.clone(), Arc::clone(p)))
            .collect())
    }

    /// The end port numbered `port`.
    ///
    /// # Errors
    /// [`Error::NotFound`] listing the ports that exist, or as
    /// [`RdmaDevice::end_ports`].
    pub fn end_port(&self, port: u32) -> Result<EndPort> {
        let ports = self.end_ports()?;
        let available = port_list(&ports);
        ports
            .into_iter()
            .find(|p| p.port_num() == port)
            .ok_or_else(|| Error::NotFound {
                what: format!("port {port} on RDMA device {}", self.name()),
                available,
            })
    }

    /// The first end port (the one `"rxe0"` names in
    /// [`super::Sysfs::find_port_name`]).
    ///
    /// # Errors
    /// [`Error::NotFound`] when the device has no ports, or as
    /// [`RdmaDevice::end_ports`].
    pub fn first_end_port(&self) -> Result<EndPort> {
        self.end_ports()?
            .into_iter()
            .next()
            .ok_or_else(|| Error::NotFound {
                what: format!("port on RDMA device {}", self.name()),
                available: "ports: none".to_string(),
            })
    }

    /// The number of physical ports of a channel adapter (its ports numbered
    /// 1 and up; verbs' `phys_port_cnt`). A switch has 0 here: sysfs lists only
    /// its management port 0.
    ///
    /// # Errors
    /// As [`RdmaDevice::end_ports`].
    pub fn phys_port_count(&self) -> Result<u32> {
        let n = self.port_inners()?.iter().filter(|p| p.port() >= 1).count();
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Opens the device for verbs (`Context::open(name)`). With
    /// [`super::Sysfs::at`] a fixture root, this opens the system's device of
    /// the same name, if there is one.
    ///
    /// # Errors
    /// As [`Context::open`].
    pub fn open(&self) -> Result<Context> {
        let ctx = Context::open(self.name())?;
        self.watch(&ctx);
        Ok(ctx)
    }

    /// Keeps this device's port caches in step with `ctx`: every port event
    /// read through [`Context::get_async_event`] (LID, P_Key, SM, GID change,
    /// client reregister, port active or error) drops the cache of its port.
    /// [`RdmaDevice::open`] does this for the context it returns.
    pub fn watch(&self, ctx: &Context) {
        let weak = Arc::downgrade(&self.inner);
        ctx.add_event_hook(Box::new(move |ev| {
            if let (true, Some(port), Some(inner)) = (ev.changes_port(), ev.port(), weak.upgrade())
            {
                RdmaDevice { inner }.invalidate_port(u32::from(port));
            }
        }));
    }

    /// Applies an asynchronous event by hand: drops the cache of the port a
    /// port-changing event names (see [`RdmaDevice::watch`]).
    pub fn apply_event(&self, ev: &crate::AsyncEvent) {
        if let (true, Some(port)) = (ev.changes_port(), ev.port()) {
            self.invalidate_port(u32::from(port));
        }
    }

    /// Drops every cached value of the device and of each of its ports; the
    /// next access reads sysfs again. [`EndPort`] handles already given out
    /// see the refresh too.
    pub fn refresh(&self) {
        let i = &self.inner;
        i.node_type.clear();
        i.node_guid.clear();
        i.sys_image_guid.clear();
        i.node_desc.clear();
        i.fw_ver.clear();
        i.hw_rev.clear();
        i.hca_type.clear();
        i.board_id.clear();
        self.for_cached_ports(|p| p.refresh());
    }

    /// Drops the cache of port `port` (as [`EndPort::refresh`]); a port the
    /// device does not have, or whose ports were never listed, is ignored.
    ///
    /// This is the hook the context's async event stream calls when it
    /// reports `IBV_EVENT_LID_CHANGE`, `IBV_EVENT_PKEY_CHANGE`,
    /// `IBV_EVENT_SM_CHANGE`, `IBV_EVENT_CLIENT_REREGISTER`,
    /// `IBV_EVENT_GID_CHANGE`, `IBV_EVENT_PORT_ACTIVE` or
    /// `IBV_EVENT_PORT_ERR` for `port`, so that the LID, P_Keys, SM, GIDs and
    /// state are read again on next use. It never blocks for longer than a
    /// sysfs read that is in progress on the same value.
    pub fn invalidate_port(&self, port: u32) {
        self.for_cached_ports(|p| {
            if p.port() == port {
                p.refresh();
            }
        });
    }

    fn for_cached_ports(&self, f: impl Fn(&PortInner)) {
        // Lists the ports only if that was done before: nothing is cached
        // for ports never listed.
        if let Some(ports) = self.inner.ports.peek() {
            ports.iter().for_each(|p| f(p));
        }
    }
}

/// `ports: rxe0/1, rxe0/2` for error messages.
pub(crate) fn port_list(ports: &[EndPort]) -> String {
    if ports.is_empty() {
        "ports: none".to_string()
    } else {
        let names: Vec<String> = ports.iter().map(EndPort::name).collect();
        format!("ports: {}", names.join(", "))
    }
}

impl fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaDevice")
            .field("name", &self.inner.name)
            .field("path", &self.inner.dir)
            .finish_non_exhaustive()
    }
}
