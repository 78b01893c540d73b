//! The values from the kernel and the providers that an [`Error`] carries:
//! a work completion's status ([`WcStatus`]) and a connection manager
//! event's type ([`CmEventType`]), with the errno a failed CM event stands
//! for. They sit below `error`, so that it imports nothing from the layers
//! that use it; users find them where they meet them, `rdma::WcStatus`
//! (from `wc`) and `rdma::cm::CmEventType` (from `cm`).

use std::fmt;

use crate::ffi;
use crate::macros::c_enum;
#[cfg(doc)]
use crate::Error;

c_enum! {
    /// `enum ibv_wc_status`. A failed completion is a value, not an error.
    pub enum WcStatus: u32 {
        /// Success.
        Success = ffi::IBV_WC_SUCCESS,
        /// Local length error (e.g. a receive buffer too small).
        LocLenErr = ffi::IBV_WC_LOC_LEN_ERR,
        /// Local QP operation error.
        LocQpOpErr = ffi::IBV_WC_LOC_QP_OP_ERR,
        /// Local EE context operation error.
        LocEecOpErr = ffi::IBV_WC_LOC_EEC_OP_ERR,
        /// Local protection error (bad lkey, MR access).
        LocProtErr = ffi::IBV_WC_LOC_PROT_ERR,
        /// Flushed: the QP went to the error state.
        WrFlushErr = ffi::IBV_WC_WR_FLUSH_ERR,
        /// Memory window bind error.
        MwBindErr = ffi::IBV_WC_MW_BIND_ERR,
        /// Bad response error.
        BadRespErr = ffi::IBV_WC_BAD_RESP_ERR,
        /// Local access error.
        LocAccessErr = ffi::IBV_WC_LOC_ACCESS_ERR,
        /// Remote invalid request error.
        RemInvReqErr = ffi::IBV_WC_REM_INV_REQ_ERR,
        /// Remote access error (bad rkey, no remote access right).
        RemAccessErr = ffi::IBV_WC_REM_ACCESS_ERR,
        /// Remote operation error.
        RemOpErr = ffi::IBV_WC_REM_OP_ERR,
        /// Transport retry counter exceeded.
        RetryExcErr = ffi::IBV_WC_RETRY_EXC_ERR,
        /// RNR retry counter exceeded.
        RnrRetryExcErr = ffi::IBV_WC_RNR_RETRY_EXC_ERR,
        /// Local RDD violation.
        LocRddViolErr = ffi::IBV_WC_LOC_RDD_VIOL_ERR,
        /// Remote invalid RD request.
        RemInvRdReqErr = ffi::IBV_WC_REM_INV_RD_REQ_ERR,
        /// Remote aborted.
        RemAbortErr = ffi::IBV_WC_REM_ABORT_ERR,
        /// Invalid EE context number.
        InvEecnErr = ffi::IBV_WC_INV_EECN_ERR,
        /// Invalid EE context state.
        InvEecStateErr = ffi::IBV_WC_INV_EEC_STATE_ERR,
        /// Fatal error.
        FatalErr = ffi::IBV_WC_FATAL_ERR,
        /// Response timeout.
        RespTimeoutErr = ffi::IBV_WC_RESP_TIMEOUT_ERR,
        /// General error.
        GeneralErr = ffi::IBV_WC_GENERAL_ERR,
        /// Tag matching error.
        TmErr = ffi::IBV_WC_TM_ERR,
        /// Tag matching rendezvous incomplete.
        TmRndvIncomplete = ffi::IBV_WC_TM_RNDV_INCOMPLETE,
    }
}

impl fmt::Display for WcStatus {
    /// The text of `ibv_wc_status_str(3)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if ffi::load_ibverbs().is_err() {
            // Only with the `dlopen` feature and no libibverbs: the name.
            return write!(f, "{self:?}");
        }
        // SAFETY: ibv_wc_status_str returns a static string for any value;
        // libibverbs is open (checked above).
        let s = unsafe { std::ffi::CStr::from_ptr(ffi::ibv_wc_status_str(self.to_raw())) };
        f.write_str(&s.to_string_lossy())
    }
}

c_enum! {
    /// `enum rdma_cm_event_type`. Prints as `rdma_event_str(3)` does.
    pub enum CmEventType: u32 {
        /// Address resolved (`rdma_resolve_addr`).
        AddrResolved = ffi::RDMA_CM_EVENT_ADDR_RESOLVED,
        /// Address resolution failed.
        AddrError = ffi::RDMA_CM_EVENT_ADDR_ERROR,
        /// Route resolved (`rdma_resolve_route`).
        RouteResolved = ffi::RDMA_CM_EVENT_ROUTE_RESOLVED,
        /// Route resolution failed.
        RouteError = ffi::RDMA_CM_EVENT_ROUTE_ERROR,
        /// A connection request on a listener; the event's id is the new
        /// connection.
        ConnectRequest = ffi::RDMA_CM_EVENT_CONNECT_REQUEST,
        /// The peer accepted, on an id without a librdmacm QP: move the QP to
        /// RTS and call [`CmId::establish`](crate::cm::CmId::establish) (see
        /// [`CmId::establish_qp`](crate::cm::CmId::establish_qp)).
        ConnectResponse = ffi::RDMA_CM_EVENT_CONNECT_RESPONSE,
        /// Connecting failed.
        ConnectError = ffi::RDMA_CM_EVENT_CONNECT_ERROR,
        /// The peer did not answer.
        Unreachable = ffi::RDMA_CM_EVENT_UNREACHABLE,
        /// The peer (or its CM) rejected the connection.
        Rejected = ffi::RDMA_CM_EVENT_REJECTED,
        /// The connection is up.
        Established = ffi::RDMA_CM_EVENT_ESTABLISHED,
        /// The connection is down.
        Disconnected = ffi::RDMA_CM_EVENT_DISCONNECTED,
        /// The device went away.
        DeviceRemoval = ffi::RDMA_CM_EVENT_DEVICE_REMOVAL,
        /// Joined a multicast group.
        MulticastJoin = ffi::RDMA_CM_EVENT_MULTICAST_JOIN,
        /// A multicast group failed.
        MulticastError = ffi::RDMA_CM_EVENT_MULTICAST_ERROR,
        /// The address the id is bound to changed.
        AddrChange = ffi::RDMA_CM_EVENT_ADDR_CHANGE,
        /// The QP of a closed connection left time-wait.
        TimewaitExit = ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT,
    }
}

impl fmt::Display for CmEventType {
    /// The text of `rdma_event_str(3)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if ffi::load_rdmacm().is_err() {
            // Only with the `dlopen` feature and no librdmacm: the name.
            return write!(f, "{self:?}");
        }
        // SAFETY: rdma_event_str returns a static string for any value;
        // librdmacm is open (checked above).
        let s = unsafe { std::ffi::CStr::from_ptr(ffi::rdma_event_str(self.to_raw())) };
        f.write_str(&s.to_string_lossy())
    }
}

/// The errno a failure event stands for ([`Error::CmEvent`]).
pub(crate) fn event_errno(event: CmEventType, status: i32) -> i32 {
    if status < 0 {
        return -status;
    }
    match event {
        CmEventType::Rejected => libc::ECONNREFUSED,
        CmEventType::Unreachable => libc::EHOSTUNREACH,
        CmEventType::AddrError => libc::EADDRNOTAVAIL,
        CmEventType::RouteError => libc::ENETUNREACH,
        CmEventType::ConnectError => libc::ECONNABORTED,
        CmEventType::Disconnected => libc::ECONNRESET,
        CmEventType::DeviceRemoval => libc::ENODEV,
        CmEventType::MulticastError => libc::EADDRNOTAVAIL,
        _ => libc::EIO,
    }
}
