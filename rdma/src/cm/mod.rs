//! RDMA connection manager (librdmacm): work in progress.
