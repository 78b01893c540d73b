//! Device and port discovery from `/sys/class/infiniband`, without opening a
//! verbs context.
//!
//! Discovery pins no memory, holds no `/dev/infiniband/uverbsN` file and works
//! for a user who may not open the devices: what RDMA tools and fabric
//! managers need to find devices and ports, their GUIDs, GIDs, P_Keys, LIDs
//! and state. [`RdmaDevice::open`] gives the verbs [`Context`](crate::Context)
//! when it is wanted.
//!
//! ```text
//! Sysfs::system() --devices()--> RdmaDevice --end_ports()--> EndPort --gids()/pkeys()--> DemandList
//! ```
//!
//! # Reading on demand
//! Nothing is read when a handle is made. Each property is read from its
//! sysfs file on first use and cached; [`RdmaDevice`] and [`EndPort`] are
//! cheap `Arc` handles whose clones share the cache, and both are `Send` and
//! `Sync`. The GID and P_Key tables are [`DemandList`]s: an entry is read when
//! asked for, iteration skips empty slots, and [`DemandList::index_of`] finds
//! a value.
//!
//! A cache does not follow changes by itself. [`RdmaDevice::refresh`],
//! [`EndPort::refresh`] and [`DemandList::refresh`] drop it.
//!
//! # Invalidation by async events
//! A port's cache must be dropped when the context's async event stream
//! reports `IBV_EVENT_LID_CHANGE`, `IBV_EVENT_PKEY_CHANGE`,
//! `IBV_EVENT_SM_CHANGE`, `IBV_EVENT_CLIENT_REREGISTER`,
//! `IBV_EVENT_GID_CHANGE`, `IBV_EVENT_PORT_ACTIVE` or `IBV_EVENT_PORT_ERR` for
//! it. The event code does this by calling [`RdmaDevice::invalidate_port`]
//! with the event's port number on the `RdmaDevice` whose handles it wants to
//! keep current; every [`EndPort`] handle of that device sees it.
//!
//! # Transports
//! Values follow the device's transport ([`RdmaDevice::transport_type`]):
//! on iWARP (and usNIC) ports the LID, LMC, SM LID, SM SL, subnet timeout and
//! port GUID are `Ok(None)`, and so is the P_Key table, which the kernel does
//! not create there. Driver-specific device files (`fw_ver`, `hw_rev`,
//! `hca_type`, `board_id`) are `Ok(None)` when absent.
//!
//! # Errors
//! A missing, unreadable or malformed file is [`Error::Sysfs`] naming the file.
//! A lookup that matches nothing is [`Error::NotFound`] (or
//! [`Error::DeviceNotFound`] for a device name) saying what exists.
//!
//! # Example
//! ```no_run
//! # fn main() -> rdma::Result<()> {
//! use rdma::sysfs::Sysfs;
//!
//! let sysfs = Sysfs::system();
//! for dev in sysfs.devices()? {
//!     println!("{} {} {}", dev.name(), dev.node_type()?, dev.node_guid()?);
//!     for port in dev.end_ports()? {
//!         println!("  {port}: {} {}", port.state()?, port.rate()?);
//!         for gid in port.gids().iter() {
//!             let (index, gid) = gid?;
//!             println!("    GID[{index}] {gid} {:?}", port.gid_netdev(index)?);
//!         }
//!     }
//! }
//! let port = sysfs.find_port_name("rxe0/1")?;
//! println!("rxe0/1 is {}", port.state()?);
//! # Ok(())
//! # }
//! ```

mod attr;
mod cache;
mod device;
mod list;
mod port;

use std::path::{Path, PathBuf};

pub use device::RdmaDevice;
pub use list::{DemandList, GidTable, PkeyTable};
pub use port::{EndPort, PhysPortState, Rate};

use crate::device::Guid;
use crate::error::{Error, Result};
use crate::gid::Gid;

/// Where discovery reads from: a sysfs mount, `/sys` on a live system, or a
/// copy of one (a fixture tree) holding `class/infiniband/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::system()
    }
}

impl Sysfs {
    /// The system's sysfs at `/sys`.
    pub fn system() -> Self {
        Sysfs::at("/sys")
    }

    /// A sysfs tree at `root`: devices are read from
    /// `root/class/infiniband/`.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Sysfs { root: root.into() }
    }

    /// The root given to [`Sysfs::at`] (`/sys`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The device directory, `root/class/infiniband`.
    pub fn class_path(&self) -> PathBuf {
        self.root.join("class").join("infiniband")
    }

    /// The names of the devices, sorted.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming `class/infiniband` when it cannot be listed
    /// (it does not exist when the kernel has no RDMA core loaded).
    pub fn device_names(&self) -> Result<Vec<String>> {
        attr::names(&self.class_path())
    }

    /// Every device, sorted by name. Nothing but the directory is read.
    ///
    /// # Errors
    /// As [`Sysfs::device_names`].
    pub fn devices(&self) -> Result<Vec<RdmaDevice>> {
        let class = self.class_path();
        Ok(self
            .device_names()?
            .into_iter()
            .map(|name| {
                let dir = class.join(&name);
                RdmaDevice::new(&name, dir)
            })
            .collect())
    }

    /// The device called `name`.
    ///
    /// # Errors
    /// [`Error::DeviceNotFound`] listing the devices present.
    pub fn device(&self, name: &str) -> Result<RdmaDevice> {
        let dir = self.class_path().join(name);
        let plain = !name.is_empty() && name != "." && name != ".." && !name.contains('/');
        if plain && dir.is_dir() {
            return Ok(RdmaDevice::new(name, dir));
        }
        Err(Error::DeviceNotFound {
            name: name.to_string(),
            available: self
                .device_names()
                .map(|n| name_list(&n))
                .unwrap_or_else(|e| format!("none: {e}")),
        })
    }

    /// The device whose node GUID is `guid` (see [`find_node_guid`]).
    ///
    /// # Errors
    /// As [`find_node_guid`] and [`Sysfs::devices`].
    pub fn find_node_guid(&self, guid: Guid) -> Result<RdmaDevice> {
        find_node_guid(&self.devices()?, guid)
    }

    /// The end port whose port GUID is `guid` (see [`find_port_guid`]).
    ///
    /// # Errors
    /// As [`find_port_guid`] and [`Sysfs::devices`].
    pub fn find_port_guid(&self, guid: Guid) -> Result<EndPort> {
        find_port_guid(&self.devices()?, guid)
    }

    /// The end port that has `gid`, and its GID index (see [`find_port_gid`]).
    ///
    /// # Errors
    /// As [`find_port_gid`] and [`Sysfs::devices`].
    pub fn find_port_gid(&self, gid: Gid) -> Result<(EndPort, u32)> {
        find_port_gid(&self.devices()?, gid)
    }

    /// The end port named `name`: `rxe0` (its first port) or `rxe0/1` (see
    /// [`find_port_name`]).
    ///
    /// # Errors
    /// As [`find_port_name`] and [`Sysfs::devices`].
    pub fn find_port_name(&self, name: &str) -> Result<EndPort> {
        find_port_name(&self.devices()?, name)
    }
}

fn name_list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

fn device_list(devices: &[RdmaDevice]) -> String {
    let names: Vec<String> = devices.iter().map(|d| d.name().to_string()).collect();
    name_list(&names)
}

/// Every end port of `devices`, with the first error met while listing them.
fn all_ports(devices: &[RdmaDevice], first_error: &mut Option<Error>) -> Vec<EndPort> {
    let mut out = Vec::new();
    for dev in devices {
        match dev.end_ports() {
            Ok(ports) => out.extend(ports),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    out
}

/// The result of a search that found nothing: the first error met (the
/// match may have been behind it), else `not_found`.
fn nothing_found<T>(first_error: Option<Error>, not_found: Error) -> Result<T> {
    Err(first_error.unwrap_or(not_found))
}

/// The device of `devices` whose node GUID is `guid`.
///
/// # Errors
/// [`Error::NotFound`] naming the GUID and the devices searched; if a device
/// could not be read and nothing matched, that read error instead.
pub fn find_node_guid(devices: &[RdmaDevice], guid: Guid) -> Result<RdmaDevice> {
    let mut first_error = None;
    for dev in devices {
        match dev.node_guid() {
            Ok(g) if g == guid => return Ok(dev.clone()),
            Ok(_) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    nothing_found(
        first_error,
        Error::NotFound {
            what: format!("RDMA device with node GUID {guid}"),
            available: format!("devices: {}", device_list(devices)),
        },
    )
}

/// The end port of `devices` whose port GUID is `guid`.
///
/// # Errors
/// [`Error::NotFound`] naming the GUID and the ports searched; if a port
/// could not be read and nothing matched, that read error instead.
pub fn find_port_guid(devices: &[RdmaDevice], guid: Guid) -> Result<EndPort> {
    let mut first_error = None;
    let ports = all_ports(devices, &mut first_error);
    for port in &ports {
        match port.port_guid() {
            Ok(Some(g)) if g == guid => return Ok(port.clone()),
            Ok(_) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    nothing_found(
        first_error,
        Error::NotFound {
            what: format!("RDMA port with port GUID {guid}"),
            available: device::port_list(&ports),
        },
    )
}

/// The end port of `devices` whose GID table holds `gid`, and its index there
/// (the lowest, if it appears twice). Reads the GID tables in order until it
/// is found.
///
/// # Errors
/// [`Error::NotFound`] naming the GID and the ports searched; if a GID table
/// could not be read and nothing matched, that read error instead.
pub fn find_port_gid(devices: &[RdmaDevice], gid: Gid) -> Result<(EndPort, u32)> {
    let mut first_error = None;
    let ports = all_ports(devices, &mut first_error);
    for port in &ports {
        match port.gids().index_of(&gid) {
            Ok(Some(index)) => return Ok((port.clone(), index)),
            Ok(None) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    nothing_found(
        first_error,
        Error::NotFound {
            what: format!("RDMA port with GID {gid}"),
            available: device::port_list(&ports),
        },
    )
}

/// The end port named `name`: a device name (`rxe0`, its first end port) or
/// `device/port` (`rxe0/1`, `switch0/0`).
///
/// # Errors
/// [`Error::DeviceNotFound`] for an unknown device, [`Error::NotFound`] for a
/// port the device does not have or a port part that is not a number.
pub fn find_port_name(devices: &[RdmaDevice], name: &str) -> Result<EndPort> {
    let (dev_name, port) = match name.split_once('/') {
        Some((d, p)) => (d, Some(p)),
        None => (name, None),
    };
    let dev = devices
        .iter()
        .find(|d| d.name() == dev_name)
        .ok_or_else(|| Error::DeviceNotFound {
            name: dev_name.to_string(),
            available: device_list(devices),
        })?;
    let Some(port) = port else {
        return dev.first_end_port();
    };
    match attr::parse_dec::<u32>(port) {
        Some(n) => dev.end_port(n),
        None => Err(Error::NotFound {
            what: format!("RDMA port named {name:?}: {port:?} is not a port number"),
            available: device::port_list(&dev.end_ports()?),
        }),
    }
}

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_send_and_sync() {
        send_sync::<super::Sysfs>();
        send_sync::<super::RdmaDevice>();
        send_sync::<super::EndPort>();
        send_sync::<super::GidTable>();
        send_sync::<super::PkeyTable>();
    }
}
