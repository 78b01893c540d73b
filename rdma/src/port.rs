//! Port attributes: `struct ibv_port_attr` (`ibv_query_port(3)`).

use std::fmt;

use crate::ffi;
use crate::macros::c_enum;

c_enum! {
    /// `enum ibv_port_state`.
    pub enum PortState: u32 {
        /// Reserved.
        Nop = ffi::IBV_PORT_NOP,
        /// Logical link is down.
        Down = ffi::IBV_PORT_DOWN,
        /// Physical link up, not yet configured by the SM.
        Init = ffi::IBV_PORT_INIT,
        /// Configured, but cannot send data yet.
        Armed = ffi::IBV_PORT_ARMED,
        /// Up and usable.
        Active = ffi::IBV_PORT_ACTIVE,
        /// Active, deferring.
        ActiveDefer = ffi::IBV_PORT_ACTIVE_DEFER,
    }
}

impl fmt::Display for PortState {
    /// The strings of `ibv_port_state_str(3)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortState::Nop => "PORT_NOP",
            PortState::Down => "PORT_DOWN",
            PortState::Init => "PORT_INIT",
            PortState::Armed => "PORT_ARMED",
            PortState::Active => "PORT_ACTIVE",
            PortState::ActiveDefer => "PORT_ACTIVE_DEFER",
            PortState::Unknown(_) => "invalid state",
        })
    }
}

c_enum! {
    /// `enum ibv_mtu`: an InfiniBand path MTU.
    pub enum Mtu: u32 {
        /// 256 bytes.
        Mtu256 = ffi::IBV_MTU_256,
        /// 512 bytes.
        Mtu512 = ffi::IBV_MTU_512,
        /// 1024 bytes.
        Mtu1024 = ffi::IBV_MTU_1024,
        /// 2048 bytes.
        Mtu2048 = ffi::IBV_MTU_2048,
        /// 4096 bytes.
        Mtu4096 = ffi::IBV_MTU_4096,
    }
}

impl Mtu {
    /// The MTU in bytes, `None` for an unknown value.
    pub fn bytes(self) -> Option<u32> {
        match self {
            Mtu::Mtu256 => Some(256),
            Mtu::Mtu512 => Some(512),
            Mtu::Mtu1024 => Some(1024),
            Mtu::Mtu2048 => Some(2048),
            Mtu::Mtu4096 => Some(4096),
            Mtu::Unknown(_) => None,
        }
    }

    /// The MTU for a size in bytes (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        [
            Mtu::Mtu256,
            Mtu::Mtu512,
            Mtu::Mtu1024,
            Mtu::Mtu2048,
            Mtu::Mtu4096,
        ]
        .into_iter()
        .find(|m| m.bytes() == Some(bytes))
    }
}

c_enum! {
    /// The link layer of a port (`IBV_LINK_LAYER_*`).
    pub enum LinkLayer: u8 {
        /// Not reported (old kernels: InfiniBand).
        Unspecified = ffi::IBV_LINK_LAYER_UNSPECIFIED,
        /// InfiniBand.
        InfiniBand = ffi::IBV_LINK_LAYER_INFINIBAND,
        /// Ethernet (RoCE, iWARP).
        Ethernet = ffi::IBV_LINK_LAYER_ETHERNET,
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkLayer::Unspecified | LinkLayer::InfiniBand => f.write_str("InfiniBand"),
            LinkLayer::Ethernet => f.write_str("Ethernet"),
            LinkLayer::Unknown(v) => write!(f, "unknown ({v})"),
        }
    }
}

bitflags::bitflags! {
    /// `port_cap_flags` (`IBV_PORT_*_SUP`, ...). Unknown bits are kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct PortCapFlags: u32 {
        /// The port runs the subnet manager.
        const SM = ffi::IBV_PORT_SM;
        /// Notices supported.
        const NOTICE_SUP = ffi::IBV_PORT_NOTICE_SUP;
        /// Traps supported.
        const TRAP_SUP = ffi::IBV_PORT_TRAP_SUP;
        /// Optional IPD supported.
        const OPT_IPD_SUP = ffi::IBV_PORT_OPT_IPD_SUP;
        /// Automatic path migration supported.
        const AUTO_MIGR_SUP = ffi::IBV_PORT_AUTO_MIGR_SUP;
        /// SL to VL mapping supported.
        const SL_MAP_SUP = ffi::IBV_PORT_SL_MAP_SUP;
        /// M_Key in NVRAM.
        const MKEY_NVRAM = ffi::IBV_PORT_MKEY_NVRAM;
        /// P_Key in NVRAM.
        const PKEY_NVRAM = ffi::IBV_PORT_PKEY_NVRAM;
        /// LED info supported.
        const LED_INFO_SUP = ffi::IBV_PORT_LED_INFO_SUP;
        /// System image GUID supported.
        const SYS_IMAGE_GUID_SUP = ffi::IBV_PORT_SYS_IMAGE_GUID_SUP;
        /// P_Key switch external port trap supported.
        const PKEY_SW_EXT_PORT_TRAP_SUP = ffi::IBV_PORT_PKEY_SW_EXT_PORT_TRAP_SUP;
        /// Extended speeds supported.
        const EXTENDED_SPEEDS_SUP = ffi::IBV_PORT_EXTENDED_SPEEDS_SUP;
        /// `port_cap_flags2` is valid.
        const CAP_MASK2_SUP = ffi::IBV_PORT_CAP_MASK2_SUP;
        /// Communication manager supported.
        const CM_SUP = ffi::IBV_PORT_CM_SUP;
        /// SNMP tunnelling supported.
        const SNMP_TUNNEL_SUP = ffi::IBV_PORT_SNMP_TUNNEL_SUP;
        /// Reinit supported.
        const REINIT_SUP = ffi::IBV_PORT_REINIT_SUP;
        /// Device management supported.
        const DEVICE_MGMT_SUP = ffi::IBV_PORT_DEVICE_MGMT_SUP;
        /// Vendor class supported.
        const VENDOR_CLASS_SUP = ffi::IBV_PORT_VENDOR_CLASS_SUP;
        /// Direct-routed notices supported.
        const DR_NOTICE_SUP = ffi::IBV_PORT_DR_NOTICE_SUP;
        /// Capability mask notices supported.
        const CAP_MASK_NOTICE_SUP = ffi::IBV_PORT_CAP_MASK_NOTICE_SUP;
        /// Boot management supported.
        const BOOT_MGMT_SUP = ffi::IBV_PORT_BOOT_MGMT_SUP;
        /// Link latency supported.
        const LINK_LATENCY_SUP = ffi::IBV_PORT_LINK_LATENCY_SUP;
        /// Client registration supported.
        const CLIENT_REG_SUP = ffi::IBV_PORT_CLIENT_REG_SUP;
        /// GIDs are IP based (RoCE).
        const IP_BASED_GIDS = ffi::IBV_PORT_IP_BASED_GIDS;
        const _ = !0;
    }
}

/// The attributes of a port (`struct ibv_port_attr`), typed.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let port = ctx.query_port(1)?;
/// println!("{:?}, active MTU {:?}, LID {}", port.state, port.active_mtu, port.lid);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// The MTU in use; use it as a connection's path MTU.
    pub active_mtu: Mtu,
    /// Length of the GID table.
    pub gid_tbl_len: u32,
    /// Capabilities.
    pub port_cap_flags: PortCapFlags,
    /// Largest message size.
    pub max_msg_sz: u32,
    /// Bad P_Key counter.
    pub bad_pkey_cntr: u32,
    /// Q_Key violation counter.
    pub qkey_viol_cntr: u32,
    /// Length of the P_Key table.
    pub pkey_tbl_len: u16,
    /// Base LID (InfiniBand).
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LID mask control.
    pub lmc: u8,
    /// Largest number of VLs.
    pub max_vl_num: u8,
    /// Subnet manager SL.
    pub sm_sl: u8,
    /// Subnet propagation delay.
    pub subnet_timeout: u8,
    /// Type of initialisation the SM performed.
    pub init_type_reply: u8,
    /// Active link width (`IB_WIDTH_*` bits: 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x).
    pub active_width: u8,
    /// Active per-lane speed (`IB_SPEED_*` bits: 1 = SDR 2.5 Gb/s ... 128 = NDR).
    pub active_speed: u8,
    /// Physical port state (1 = sleep ... 5 = LinkUp).
    pub phys_state: u8,
    /// Link layer (extended field: only the header macro sets it).
    pub link_layer: LinkLayer,
    /// `IBV_QPF_*` flags (extended field), e.g. GRH required.
    pub flags: u8,
    /// `IBV_PORT_*` capability flags 2 (extended field).
    pub port_cap_flags2: u16,
    pub(crate) raw: ffi::ibv_port_attr,
}

impl PortAttr {
    pub(crate) fn from_raw(raw: ffi::ibv_port_attr) -> Self {
        PortAttr {
            state: PortState::from_raw(raw.state),
            max_mtu: Mtu::from_raw(raw.max_mtu),
            active_mtu: Mtu::from_raw(raw.active_mtu),
            gid_tbl_len: u32::try_from(raw.gid_tbl_len).unwrap_or(0),
            port_cap_flags: PortCapFlags::from_bits_retain(raw.port_cap_flags),
            max_msg_sz: raw.max_msg_sz,
            bad_pkey_cntr: raw.bad_pkey_cntr,
            qkey_viol_cntr: raw.qkey_viol_cntr,
            pkey_tbl_len: raw.pkey_tbl_len,
            lid: raw.lid,
            sm_lid: raw.sm_lid,
            lmc: raw.lmc,
            max_vl_num: raw.max_vl_num,
            sm_sl: raw.sm_sl,
            subnet_timeout: raw.subnet_timeout,
            init_type_reply: raw.init_type_reply,
            active_width: raw.active_width,
            active_speed: raw.active_speed,
            phys_state: raw.phys_state,
            link_layer: LinkLayer::from_raw(raw.link_layer),
            flags: raw.flags,
            port_cap_flags2: raw.port_cap_flags2,
            raw,
        }
    }

    /// The number of lanes `active_width` stands for.
    pub fn width_lanes(&self) -> Option<u32> {
        match self.active_width {
            1 => Some(1),
            2 => Some(4),
            4 => Some(8),
            8 => Some(12),
            16 => Some(2),
            _ => None,
        }
    }

    /// The per-lane speed in Gb/s `active_speed` stands for, and its name.
    pub fn lane_speed(&self) -> Option<(f64, &'static str)> {
        Some(match self.active_speed {
            1 => (2.5, "SDR"),
            2 => (5.0, "DDR"),
            4 => (10.0, "QDR"),
            8 => (10.3125, "FDR10"),
            16 => (14.0625, "FDR"),
            32 => (25.78125, "EDR"),
            64 => (53.125, "HDR"),
            128 => (106.25, "NDR"),
            _ => return None,
        })
    }

    /// The nominal data rate in Gb/s (lanes × per-lane rate, as the kernel's
    /// sysfs `rate` file gives it), `None` for unknown width or speed codes.
    pub fn rate_gbps(&self) -> Option<f64> {
        let lanes = self.width_lanes()?;
        // sysfs uses the nominal lane rates: 2.5, 5, 10, 10, 14, 25, 50, 100.
        let nominal = match self.active_speed {
            1 => 2.5,
            2 => 5.0,
            4 | 8 => 10.0,
            16 => 14.0,
            32 => 25.0,
            64 => 50.0,
            128 => 100.0,
            _ => return None,
        };
        Some(f64::from(lanes) * nominal)
    }

    /// The raw C struct.
    pub fn as_raw(&self) -> &ffi::ibv_port_attr {
        &self.raw
    }
}

impl fmt::Debug for PortAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortAttr")
            .field("state", &self.state)
            .field("max_mtu", &self.max_mtu)
            .field("active_mtu", &self.active_mtu)
            .field("gid_tbl_len", &self.gid_tbl_len)
            .field("port_cap_flags", &self.port_cap_flags)
            .field("max_msg_sz", &self.max_msg_sz)
            .field("pkey_tbl_len", &self.pkey_tbl_len)
            .field("lid", &self.lid)
            .field("sm_lid", &self.sm_lid)
            .field("lmc", &self.lmc)
            .field("active_width", &self.active_width)
            .field("active_speed", &self.active_speed)
            .field("phys_state", &self.phys_state)
            .field("link_layer", &self.link_layer)
            .field("flags", &self.flags)
            .field("port_cap_flags2", &self.port_cap_flags2)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_round_trips() {
        for b in [256, 512, 1024, 2048, 4096] {
            let m = Mtu::from_bytes(b).unwrap();
            assert_eq!(m.bytes(), Some(b));
            assert_eq!(Mtu::from_raw(m.to_raw()), m);
        }
        assert_eq!(Mtu::from_bytes(1500), None);
        assert_eq!(Mtu::from_raw(9).bytes(), None);
    }

    #[test]
    fn rate_is_lanes_times_lane_speed() {
        let raw = ffi::ibv_port_attr {
            active_width: 2,
            active_speed: 32,
            ..Default::default()
        };
        assert_eq!(PortAttr::from_raw(raw).rate_gbps(), Some(100.0));
        let raw = ffi::ibv_port_attr {
            active_width: 1,
            active_speed: 1,
            ..Default::default()
        };
        assert_eq!(PortAttr::from_raw(raw).rate_gbps(), Some(2.5));
        let raw = ffi::ibv_port_attr {
            active_width: 3,
            ..Default::default()
        };
        assert_eq!(PortAttr::from_raw(raw).rate_gbps(), None);
    }

    #[test]
    fn unknown_port_state_and_flags_survive() {
        assert_eq!(PortState::from_raw(77), PortState::Unknown(77));
        let f = PortCapFlags::from_bits_retain(0x8000_0000 | ffi::IBV_PORT_CM_SUP);
        assert!(f.contains(PortCapFlags::CM_SUP));
        assert_eq!(f.bits() & 0x8000_0000, 0x8000_0000);
    }
}
