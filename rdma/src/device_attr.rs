//! Device attributes: `struct ibv_device_attr_ex` (`ibv_query_device_ex(3)`).

use std::ffi::CStr;
use std::fmt;

use crate::device::Guid;
use crate::ffi;
use crate::macros::c_enum;

c_enum! {
    /// `enum ibv_atomic_cap`.
    pub enum AtomicCap: u32 {
        /// No atomic operations.
        None = ffi::IBV_ATOMIC_NONE,
        /// Atomic between QPs of this device only.
        Hca = ffi::IBV_ATOMIC_HCA,
        /// Atomic against every other agent, CPU included.
        Glob = ffi::IBV_ATOMIC_GLOB,
    }
}

bitflags::bitflags! {
    /// Device capabilities: `device_cap_flags` together with the 64-bit
    /// `device_cap_flags_ex`. Unknown bits are kept.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct DeviceCapFlags: u64 {
        /// Resizing the max WRs of a QP is supported.
        const RESIZE_MAX_WR = ffi::IBV_DEVICE_RESIZE_MAX_WR as u64;
        /// Bad P_Key counter.
        const BAD_PKEY_CNTR = ffi::IBV_DEVICE_BAD_PKEY_CNTR as u64;
        /// Bad Q_Key counter.
        const BAD_QKEY_CNTR = ffi::IBV_DEVICE_BAD_QKEY_CNTR as u64;
        /// Raw multicast.
        const RAW_MULTI = ffi::IBV_DEVICE_RAW_MULTI as u64;
        /// Automatic path migration.
        const AUTO_PATH_MIG = ffi::IBV_DEVICE_AUTO_PATH_MIG as u64;
        /// Changing the primary port.
        const CHANGE_PHY_PORT = ffi::IBV_DEVICE_CHANGE_PHY_PORT as u64;
        /// UD address vector port enforcement.
        const UD_AV_PORT_ENFORCE = ffi::IBV_DEVICE_UD_AV_PORT_ENFORCE as u64;
        /// Current QP state modifier.
        const CURR_QP_STATE_MOD = ffi::IBV_DEVICE_CURR_QP_STATE_MOD as u64;
        /// Port shutdown.
        const SHUTDOWN_PORT = ffi::IBV_DEVICE_SHUTDOWN_PORT as u64;
        /// Init type.
        const INIT_TYPE = ffi::IBV_DEVICE_INIT_TYPE as u64;
        /// Port active event.
        const PORT_ACTIVE_EVENT = ffi::IBV_DEVICE_PORT_ACTIVE_EVENT as u64;
        /// System image GUID.
        const SYS_IMAGE_GUID = ffi::IBV_DEVICE_SYS_IMAGE_GUID as u64;
        /// RNR NAK generation on RC.
        const RC_RNR_NAK_GEN = ffi::IBV_DEVICE_RC_RNR_NAK_GEN as u64;
        /// SRQ resize.
        const SRQ_RESIZE = ffi::IBV_DEVICE_SRQ_RESIZE as u64;
        /// N-notify CQ.
        const N_NOTIFY_CQ = ffi::IBV_DEVICE_N_NOTIFY_CQ as u64;
        /// Memory windows.
        const MEM_WINDOW = ffi::IBV_DEVICE_MEM_WINDOW as u64;
        /// UD IP checksum offload.
        const UD_IP_CSUM = ffi::IBV_DEVICE_UD_IP_CSUM as u64;
        /// XRC.
        const XRC = ffi::IBV_DEVICE_XRC as u64;
        /// Memory management extensions.
        const MEM_MGT_EXTENSIONS = ffi::IBV_DEVICE_MEM_MGT_EXTENSIONS as u64;
        /// Type 2A memory windows.
        const MEM_WINDOW_TYPE_2A = ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2A as u64;
        /// Type 2B memory windows.
        const MEM_WINDOW_TYPE_2B = ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B as u64;
        /// RC IP checksum offload.
        const RC_IP_CSUM = ffi::IBV_DEVICE_RC_IP_CSUM as u64;
        /// Raw IP checksum offload.
        const RAW_IP_CSUM = ffi::IBV_DEVICE_RAW_IP_CSUM as u64;
        /// Managed flow steering.
        const MANAGED_FLOW_STEERING = ffi::IBV_DEVICE_MANAGED_FLOW_STEERING as u64;
        /// Raw packet scatter FCS.
        const RAW_SCATTER_FCS = ffi::IBV_DEVICE_RAW_SCATTER_FCS;
        /// PCI write end padding.
        const PCI_WRITE_END_PADDING = ffi::IBV_DEVICE_PCI_WRITE_END_PADDING;
        const _ = !0;
    }
}

/// A device's attributes (`struct ibv_device_attr_ex`), typed.
///
/// Counts the C struct holds as `int` are returned as `u32` (a negative value,
/// which no provider reports, reads as 0). [`DeviceAttr::as_raw`] gives every
/// field, including those without an accessor yet.
///
/// ```no_run
/// # fn main() -> rdma::Result<()> {
/// let ctx = rdma::Context::open("rxe0")?;
/// let attr = ctx.query_device()?;
/// println!("firmware {}, {} ports, up to {} work requests a queue",
///     attr.fw_ver(), attr.phys_port_cnt(), attr.max_qp_wr());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct DeviceAttr {
    raw: ffi::ibv_device_attr_ex,
}

macro_rules! count_accessors {
    ($( $(#[$m:meta])* $name:ident ),* $(,)?) => {
        $(
            $(#[$m])*
            pub fn $name(&self) -> u32 {
                u32::try_from(self.raw.orig_attr.$name).unwrap_or(0)
            }
        )*
    };
}

impl DeviceAttr {
    pub(crate) fn from_raw(raw: ffi::ibv_device_attr_ex) -> Self {
        DeviceAttr { raw }
    }

    /// The legacy attributes only (the extended fields zero).
    pub(crate) fn from_limits(orig: &ffi::ibv_device_attr) -> Self {
        DeviceAttr {
            raw: ffi::ibv_device_attr_ex {
                orig_attr: *orig,
                ..Default::default()
            },
        }
    }

    /// The raw C struct.
    pub fn as_raw(&self) -> &ffi::ibv_device_attr_ex {
        &self.raw
    }

    /// Firmware version string.
    pub fn fw_ver(&self) -> String {
        // SAFETY: the kernel NUL-terminates fw_ver within its 64 bytes; the
        // struct was zeroed before the query.
        let s = unsafe { CStr::from_ptr(self.raw.orig_attr.fw_ver.as_ptr()) };
        s.to_string_lossy().into_owned()
    }

    /// Node GUID.
    pub fn node_guid(&self) -> Guid {
        Guid::from_be(self.raw.orig_attr.node_guid)
    }

    /// System image GUID.
    pub fn sys_image_guid(&self) -> Guid {
        Guid::from_be(self.raw.orig_attr.sys_image_guid)
    }

    /// Largest registrable memory region, bytes.
    pub fn max_mr_size(&self) -> u64 {
        self.raw.orig_attr.max_mr_size
    }

    /// Supported page sizes (bit mask).
    pub fn page_size_cap(&self) -> u64 {
        self.raw.orig_attr.page_size_cap
    }

    /// IEEE vendor id.
    pub fn vendor_id(&self) -> u32 {
        self.raw.orig_attr.vendor_id
    }

    /// Vendor part id.
    pub fn vendor_part_id(&self) -> u32 {
        self.raw.orig_attr.vendor_part_id
    }

    /// Hardware version.
    pub fn hw_ver(&self) -> u32 {
        self.raw.orig_attr.hw_ver
    }

    /// Capability flags (legacy and extended bits).
    pub fn device_cap_flags(&self) -> DeviceCapFlags {
        DeviceCapFlags::from_bits_retain(
            u64::from(self.raw.orig_attr.device_cap_flags) | self.raw.device_cap_flags_ex,
        )
    }

    /// Atomic operation support.
    pub fn atomic_cap(&self) -> AtomicCap {
        AtomicCap::from_raw(self.raw.orig_attr.atomic_cap)
    }

    /// Largest P_Key table.
    pub fn max_pkeys(&self) -> u16 {
        self.raw.orig_attr.max_pkeys
    }

    /// Local CA ACK delay.
    pub fn local_ca_ack_delay(&self) -> u8 {
        self.raw.orig_attr.local_ca_ack_delay
    }

    /// Number of physical ports.
    pub fn phys_port_cnt(&self) -> u8 {
        self.raw.orig_attr.phys_port_cnt
    }

    /// On-demand paging general capabilities (`IBV_ODP_SUPPORT*` bits);
    /// [`DeviceAttr::odp_caps`] has them, and the per-transport ones, typed.
    pub fn odp_general_caps(&self) -> u64 {
        self.raw.odp_caps.general_caps
    }

    /// Completion timestamp mask (0: no timestamps).
    pub fn completion_timestamp_mask(&self) -> u64 {
        self.raw.completion_timestamp_mask
    }

    /// Core clock in kHz (0: unknown).
    pub fn hca_core_clock(&self) -> u64 {
        self.raw.hca_core_clock
    }

    /// Device memory size, bytes.
    pub fn max_dm_size(&self) -> u64 {
        self.raw.max_dm_size
    }

    count_accessors! {
        /// Largest number of QPs.
        max_qp,
        /// Largest number of outstanding WRs on a queue.
        max_qp_wr,
        /// Largest number of scatter/gather entries of a send or receive WR.
        max_sge,
        /// Largest number of scatter/gather entries of an RDMA READ.
        max_sge_rd,
        /// Largest number of CQs.
        max_cq,
        /// Largest number of entries of a CQ.
        max_cqe,
        /// Largest number of MRs.
        max_mr,
        /// Largest number of PDs.
        max_pd,
        /// Largest number of outstanding RDMA READ/atomic as target, per QP.
        max_qp_rd_atom,
        /// EE equivalent of `max_qp_rd_atom`.
        max_ee_rd_atom,
        /// Total outstanding RDMA READ/atomic resources as target.
        max_res_rd_atom,
        /// Largest number of outstanding RDMA READ/atomic as initiator, per QP.
        max_qp_init_rd_atom,
        /// EE equivalent of `max_qp_init_rd_atom`.
        max_ee_init_rd_atom,
        /// Largest number of EE contexts.
        max_ee,
        /// Largest number of RDDs.
        max_rdd,
        /// Largest number of memory windows.
        max_mw,
        /// Largest number of raw IPv6 QPs.
        max_raw_ipv6_qp,
        /// Largest number of raw Ethertype QPs.
        max_raw_ethy_qp,
        /// Largest number of multicast groups.
        max_mcast_grp,
        /// Largest number of QPs per multicast group.
        max_mcast_qp_attach,
        /// Largest number of QPs attached to multicast groups.
        max_total_mcast_qp_attach,
        /// Largest number of address handles.
        max_ah,
        /// Largest number of FMRs.
        max_fmr,
        /// Largest number of remaps per FMR.
        max_map_per_fmr,
        /// Largest number of SRQs.
        max_srq,
        /// Largest number of WRs of an SRQ.
        max_srq_wr,
        /// Largest number of scatter/gather entries of an SRQ WR.
        max_srq_sge,
    }
}

impl fmt::Debug for DeviceAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceAttr")
            .field("fw_ver", &self.fw_ver())
            .field("node_guid", &self.node_guid())
            .field("sys_image_guid", &self.sys_image_guid())
            .field("vendor_id", &self.vendor_id())
            .field("max_qp", &self.max_qp())
            .field("max_qp_wr", &self.max_qp_wr())
            .field("max_sge", &self.max_sge())
            .field("max_cq", &self.max_cq())
            .field("max_cqe", &self.max_cqe())
            .field("max_mr", &self.max_mr())
            .field("max_pd", &self.max_pd())
            .field("atomic_cap", &self.atomic_cap())
            .field("device_cap_flags", &self.device_cap_flags())
            .field("phys_port_cnt", &self.phys_port_cnt())
            .finish_non_exhaustive()
    }
}
