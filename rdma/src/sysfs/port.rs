//! End ports: `/sys/class/infiniband/<device>/ports/<n>/`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::attr::{
    malformed, parse_dec, parse_gid, parse_hex, parse_link_layer, parse_numbered, parse_rate, read,
    read_optional, read_parsed,
};
use super::cache::Lazy;
use super::list::{DemandList, GidTable, Kind, PkeyTable};
use super::RdmaDevice;
use crate::device::{Guid, TransportType};
use crate::error::{Error, Result};
use crate::gid::{Gid, GidType};
use crate::macros::c_enum;
use crate::port::{LinkLayer, PortCapFlags, PortState};

c_enum! {
    /// The physical state of a port (`phys_state`; IBA PortPhysicalState).
    pub enum PhysPortState: u8 {
        /// Sleep.
        Sleep = 1,
        /// Polling: looking for a link partner.
        Polling = 2,
        /// Disabled.
        Disabled = 3,
        /// Port configuration training.
        PortConfigurationTraining = 4,
        /// The physical link is up.
        LinkUp = 5,
        /// Recovering from a link error.
        LinkErrorRecovery = 6,
        /// PHY test mode.
        PhyTest = 7,
    }
}

impl fmt::Display for PhysPortState {
    /// The names sysfs prints after the number (`5: LinkUp`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PhysPortState::Sleep => "Sleep",
            PhysPortState::Polling => "Polling",
            PhysPortState::Disabled => "Disabled",
            PhysPortState::PortConfigurationTraining => "PortConfigurationTraining",
            PhysPortState::LinkUp => "LinkUp",
            PhysPortState::LinkErrorRecovery => "LinkErrorRecovery",
            PhysPortState::PhyTest => "Phy Test",
            PhysPortState::Unknown(_) => "<unknown>",
        })
    }
}

/// The active data rate of a port, from its `rate` file.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Rate {
    /// The text as sysfs gives it, e.g. `100 Gb/sec (4X EDR)`.
    pub text: String,
    /// The rate in Gb/s: lanes × nominal lane rate (`100.0`, `2.5`).
    pub gbps: f64,
    /// The link width in lanes (`4` for `4X`), when the file names it.
    pub lanes: Option<u32>,
    /// The lane speed (`SDR` ... `NDR`), when the file names it.
    pub speed: Option<String>,
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What `gid_attrs/types/<i>` says. The kernel prints one string for both IB
/// and RoCE v1 GIDs; the port's transport and link layer tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GidTypeName {
    IbOrRoceV1,
    RoceV2,
}

fn parse_gid_entry(text: &str) -> Option<Option<Gid>> {
    let gid = parse_gid(text)?;
    Some((!gid.is_zero()).then_some(gid))
}

fn parse_pkey_entry(text: &str) -> Option<Option<u16>> {
    let pkey = parse_hex::<u16>(text)?;
    Some((pkey != 0).then_some(pkey))
}

fn parse_gid_type_entry(text: &str) -> Option<Option<GidTypeName>> {
    match text.trim() {
        "" => Some(None),
        "IB/RoCE v1" => Some(Some(GidTypeName::IbOrRoceV1)),
        "RoCE v2" => Some(Some(GidTypeName::RoceV2)),
        _ => None,
    }
}

fn parse_netdev_entry(text: &str) -> Option<Option<String>> {
    let name = text.trim();
    if name.contains(char::is_whitespace) || name.contains('/') {
        return None;
    }
    Some((!name.is_empty()).then(|| name.to_string()))
}

/// The per-port caches, shared by every [`EndPort`] handle of one
/// [`RdmaDevice`].
pub(crate) struct PortInner {
    port: u32,
    dir: PathBuf,
    state: Lazy<PortState>,
    phys_state: Lazy<PhysPortState>,
    lid: Lazy<u16>,
    lmc: Lazy<u8>,
    sm_lid: Lazy<u16>,
    sm_sl: Lazy<u8>,
    subnet_timeout: Lazy<Option<u8>>,
    rate: Lazy<Rate>,
    cap_mask: Lazy<PortCapFlags>,
    link_layer: Lazy<LinkLayer>,
    gids: GidTable,
    gid_types: DemandList<GidTypeName>,
    gid_ndevs: DemandList<String>,
    pkeys: PkeyTable,
}

impl PortInner {
    pub(crate) fn new(device: &str, device_dir: &Path, port: u32) -> Self {
        let dir = device_dir.join("ports").join(port.to_string());
        PortInner {
            port,
            state: Lazy::new(),
            phys_state: Lazy::new(),
            lid: Lazy::new(),
            lmc: Lazy::new(),
            sm_lid: Lazy::new(),
            sm_sl: Lazy::new(),
            subnet_timeout: Lazy::new(),
            rate: Lazy::new(),
            cap_mask: Lazy::new(),
            link_layer: Lazy::new(),
            gids: DemandList::new(
                dir.join("gids"),
                device,
                port,
                Kind::Gid,
                parse_gid_entry,
                "a GID like fe80:0000:0000:0000:0002:c903:0010:abcd",
            ),
            gid_types: DemandList::new(
                dir.join("gid_attrs").join("types"),
                device,
                port,
                Kind::GidAttr,
                parse_gid_type_entry,
                "\"IB/RoCE v1\" or \"RoCE v2\"",
            ),
            gid_ndevs: DemandList::new(
                dir.join("gid_attrs").join("ndevs"),
                device,
                port,
                Kind::GidAttr,
                parse_netdev_entry,
                "a network interface name",
            ),
            pkeys: DemandList::new(
                dir.join("pkeys"),
                device,
                port,
                Kind::Pkey,
                parse_pkey_entry,
                "a P_Key like 0xffff",
            ),
            dir,
        }
    }

    pub(crate) fn port(&self) -> u32 {
        self.port
    }

    pub(crate) fn refresh(&self) {
        self.state.clear();
        self.phys_state.clear();
        self.lid.clear();
        self.lmc.clear();
        self.sm_lid.clear();
        self.sm_sl.clear();
        self.subnet_timeout.clear();
        self.rate.clear();
        self.cap_mask.clear();
        self.link_layer.clear();
        self.gids.refresh();
        self.gid_types.refresh();
        self.gid_ndevs.refresh();
        self.pkeys.refresh();
    }
}

/// An end port of an [`RdmaDevice`]: port 0 of a switch, port 1 and up of a
/// channel adapter. Made by [`RdmaDevice::end_ports`] and the lookups of
/// [`super::Sysfs`].
///
/// Every property is read from `ports/<n>/` on first use and cached; clones
/// share the cache. [`EndPort::refresh`] (or [`RdmaDevice::invalidate_port`])
/// drops it, so the next access reads sysfs again.
///
/// Properties that only InfiniBand addressing has (LID, LMC, SM LID, SM SL,
/// subnet timeout) are `Ok(None)` on ports of another transport (iWARP,
/// usNIC); on RoCE ports they are what the kernel reports (0). The P_Key
/// table is `Ok(None)` where the port has none (iWARP).
#[derive(Clone)]
pub struct EndPort {
    device: RdmaDevice,
    inner: Arc<PortInner>,
}

impl EndPort {
    pub(crate) fn new(device: RdmaDevice, inner: Arc<PortInner>) -> Self {
        EndPort { device, inner }
    }

    /// The device the port belongs to.
    pub fn device(&self) -> &RdmaDevice {
        &self.device
    }

    /// The port number: 0 for a switch's management port, 1 and up for a
    /// channel adapter (the number verbs take).
    pub fn port_num(&self) -> u32 {
        self.inner.port
    }

    /// `device/port`, e.g. `rxe0/1`, as [`super::Sysfs::find_port_name`]
    /// accepts it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.device.name(), self.inner.port)
    }

    /// The port's sysfs directory.
    pub fn path(&self) -> &Path {
        &self.inner.dir
    }

    fn file(&self, name: &str) -> PathBuf {
        self.inner.dir.join(name)
    }

    /// Whether the port's device has InfiniBand addressing (LIDs, SM).
    fn has_ib_addressing(&self) -> Result<bool> {
        Ok(self.device.transport_type()? == TransportType::InfiniBand)
    }

    /// The logical port state (`state`, e.g. `4: ACTIVE`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it is missing or malformed (as
    /// for every property below).
    pub fn state(&self) -> Result<PortState> {
        self.inner.state.get_or_read(|| {
            read_parsed(&self.file("state"), "\"<number>: <name>\"", |t| {
                parse_numbered::<u32>(t).map(|(v, _)| PortState::from_raw(v))
            })
        })
    }

    /// The physical port state (`phys_state`, e.g. `5: LinkUp`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn phys_state(&self) -> Result<PhysPortState> {
        self.inner.phys_state.get_or_read(|| {
            read_parsed(&self.file("phys_state"), "\"<number>: <name>\"", |t| {
                parse_numbered::<u8>(t).map(|(v, _)| PhysPortState::from_raw(v))
            })
        })
    }

    /// The base LID (`lid`); `None` on a port without InfiniBand addressing.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn lid(&self) -> Result<Option<u16>> {
        if !self.has_ib_addressing()? {
            return Ok(None);
        }
        self.inner
            .lid
            .get_or_read(|| read_parsed(&self.file("lid"), "a hexadecimal LID", parse_hex))
            .map(Some)
    }

    /// The LID mask count (`lid_mask_count`); `None` on a port without
    /// InfiniBand addressing.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn lmc(&self) -> Result<Option<u8>> {
        if !self.has_ib_addressing()? {
            return Ok(None);
        }
        self.inner
            .lmc
            .get_or_read(|| {
                read_parsed(&self.file("lid_mask_count"), "a number 0..=255", parse_dec)
            })
            .map(Some)
    }

    /// The LID of the subnet manager (`sm_lid`); `None` on a port without
    /// InfiniBand addressing.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn sm_lid(&self) -> Result<Option<u16>> {
        if !self.has_ib_addressing()? {
            return Ok(None);
        }
        self.inner
            .sm_lid
            .get_or_read(|| read_parsed(&self.file("sm_lid"), "a hexadecimal LID", parse_hex))
            .map(Some)
    }

    /// The service level to reach the subnet manager (`sm_sl`); `None` on a
    /// port without InfiniBand addressing.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn sm_sl(&self) -> Result<Option<u8>> {
        if !self.has_ib_addressing()? {
            return Ok(None);
        }
        self.inner
            .sm_sl
            .get_or_read(|| read_parsed(&self.file("sm_sl"), "a number 0..=255", parse_dec))
            .map(Some)
    }

    /// The subnet timeout (`subnet_timeout`); `None` on a port without
    /// InfiniBand addressing, and where the kernel has no such file (Linux
    /// does not export it as of 6.x).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file when it exists but is malformed.
    pub fn subnet_timeout(&self) -> Result<Option<u8>> {
        if !self.has_ib_addressing()? {
            return Ok(None);
        }
        self.inner.subnet_timeout.get_or_read(|| {
            let path = self.file("subnet_timeout");
            match read_optional(&path)? {
                None => Ok(None),
                Some(text) => parse_dec(&text)
                    .map(Some)
                    .ok_or_else(|| malformed(&path, &text, "a number 0..=255")),
            }
        })
    }

    /// The active data rate (`rate`, e.g. `100 Gb/sec (4X EDR)`).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file (the kernel fails the read with
    /// `EINVAL` when the port reports an invalid width).
    pub fn rate(&self) -> Result<Rate> {
        self.inner.rate.get_or_read(|| {
            let path = self.file("rate");
            let text = read(&path)?;
            let parsed = parse_rate(&text)
                .ok_or_else(|| malformed(&path, &text, "\"<n> Gb/sec (<w>X <speed>)\""))?;
            Ok(Rate {
                text,
                gbps: parsed.gbps,
                lanes: parsed.lanes,
                speed: parsed.speed,
            })
        })
    }

    /// The capability mask (`cap_mask`), as verbs' `port_cap_flags`.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn cap_mask(&self) -> Result<PortCapFlags> {
        self.inner.cap_mask.get_or_read(|| {
            read_parsed(&self.file("cap_mask"), "a hexadecimal mask", |t| {
                parse_hex::<u32>(t).map(PortCapFlags::from_bits_retain)
            })
        })
    }

    /// The link layer (`link_layer`): InfiniBand or Ethernet (RoCE, iWARP);
    /// [`LinkLayer::Unspecified`] where the kernel prints `Unknown`.
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the file.
    pub fn link_layer(&self) -> Result<LinkLayer> {
        self.inner.link_layer.get_or_read(|| {
            read_parsed(
                &self.file("link_layer"),
                "InfiniBand, Ethernet or Unknown",
                parse_link_layer,
            )
        })
    }

    /// The GID table (`gids/`), indexed by GID index; empty slots read as
    /// `Ok(None)`.
    pub fn gids(&self) -> &GidTable {
        &self.inner.gids
    }

    /// The default GID: entry 0 of the GID table (subnet prefix and port GUID
    /// on InfiniBand; the link-local GID on RoCE).
    ///
    /// # Errors
    /// [`Error::EmptyGid`] when entry 0 is empty, otherwise as
    /// [`super::DemandList::get`].
    pub fn default_gid(&self) -> Result<Gid> {
        self.inner.gids.get(0)?.ok_or_else(|| Error::EmptyGid {
            device: self.device.name().to_string(),
            port: self.inner.port,
            index: 0,
        })
    }

    /// The port GUID: the interface ID of the default GID. `None` on an iWARP
    /// or usNIC port, whose GIDs are not built from a GUID.
    ///
    /// # Errors
    /// As [`EndPort::default_gid`].
    pub fn port_guid(&self) -> Result<Option<Guid>> {
        if !self.has_ib_addressing()? {
            return Ok(None);
        }
        Ok(Some(Guid(self.default_gid()?.interface_id())))
    }

    /// The type of GID `index` (`gid_attrs/types/<index>`); `None` for an
    /// empty slot.
    ///
    /// sysfs prints `IB/RoCE v1` for both kinds: it is
    /// [`GidType::RoceV1`] on a RoCE port (InfiniBand transport, Ethernet link
    /// layer) and [`GidType::Ib`] otherwise, as verbs report them.
    ///
    /// # Errors
    /// [`Error::InvalidGidIndex`] outside the table, [`Error::Sysfs`] naming
    /// the file.
    pub fn gid_type(&self, index: u32) -> Result<Option<GidType>> {
        if self.inner.gids.get(index)?.is_none() {
            return Ok(None);
        }
        let Some(name) = self.inner.gid_types.get_unchecked(index)? else {
            return Ok(None);
        };
        Ok(Some(match name {
            GidTypeName::RoceV2 => GidType::RoceV2,
            GidTypeName::IbOrRoceV1 => {
                if self.has_ib_addressing()? && self.link_layer()? == LinkLayer::Ethernet {
                    GidType::RoceV1
                } else {
                    GidType::Ib
                }
            }
        }))
    }

    /// The network device behind GID `index` (`gid_attrs/ndevs/<index>`,
    /// e.g. `eth0`); `None` for an empty slot or a GID without one
    /// (InfiniBand, iWARP).
    ///
    /// # Errors
    /// [`Error::InvalidGidIndex`] outside the table, [`Error::Sysfs`] naming
    /// the file.
    pub fn gid_netdev(&self, index: u32) -> Result<Option<String>> {
        if self.inner.gids.get(index)?.is_none() {
            return Ok(None);
        }
        self.inner.gid_ndevs.get_unchecked(index)
    }

    /// The P_Key table (`pkeys/`), indexed by P_Key index; `None` when the
    /// port has none (iWARP).
    ///
    /// # Errors
    /// [`Error::Sysfs`] naming the directory when it cannot be listed.
    pub fn pkeys(&self) -> Result<Option<&PkeyTable>> {
        Ok(self.inner.pkeys.try_indices()?.map(|_| &self.inner.pkeys))
    }

    /// Drops every cached value of this port (its attributes, GIDs, GID
    /// attributes and P_Keys), for every handle of it; the next access reads
    /// sysfs again.
    ///
    /// This is the hook for the async event stream: on
    /// `IBV_EVENT_LID_CHANGE`, `IBV_EVENT_PKEY_CHANGE`, `IBV_EVENT_SM_CHANGE`,
    /// `IBV_EVENT_CLIENT_REREGISTER`, `IBV_EVENT_GID_CHANGE`,
    /// `IBV_EVENT_PORT_ACTIVE` and `IBV_EVENT_PORT_ERR` for this port it
    /// calls this (through [`RdmaDevice::invalidate_port`]).
    pub fn refresh(&self) {
        self.inner.refresh();
    }
}

impl fmt::Display for EndPort {
    /// `device/port`, e.g. `rxe0/1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.device.name(), self.inner.port)
    }
}

impl fmt::Debug for EndPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndPort")
            .field("device", &self.device.name())
            .field("port", &self.inner.port)
            .field("path", &self.inner.dir)
            .finish_non_exhaustive()
    }
}
