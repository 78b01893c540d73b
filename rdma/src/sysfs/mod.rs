//! Device and port discovery from `/sys/class/infiniband` (work in progress).
