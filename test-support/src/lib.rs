//! What the workspace's device tests share beyond one crate (a dev-dependency
//! of `rdma-verbs` and `rdma-nfs`, never published).
//!
//! [`link`]: deleting an RDMA device under a process and adding it again
//! (`rdma link`), waiting for sysfs to show it, the descriptors a process
//! holds on the device's `uverbs` node, and a test run again as a child
//! process under a bound, so that a removal the kernel waits on can be
//! ended by killing the child. `rdma/tests/device_removal.rs` tests the
//! crate under a removal; `nfs/tests/device_removal.rs` tests the NFS client
//! and the kernel's NFS server under one; both take the mechanics from here.

pub mod link;
