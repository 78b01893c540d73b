//! The names of NFS version 3 statuses (`nfsstat3`), which MOUNT version 3
//! shares (`mountstat3`: the numbers agree): below `mount` and `nfs3`,
//! which both name them (re-exported as [`crate::nfs3::status_name`]).

/// The name of an NFS status (or MOUNT status: the numbers agree).
pub fn status_name(s: u32) -> String {
    let n = match s {
        1 => "NFS3ERR_PERM: not owner",
        2 => "NFS3ERR_NOENT: no such file or directory",
        5 => "NFS3ERR_IO: I/O error",
        6 => "NFS3ERR_NXIO",
        13 => "NFS3ERR_ACCES: permission denied",
        17 => "NFS3ERR_EXIST: file exists",
        18 => "NFS3ERR_XDEV",
        19 => "NFS3ERR_NODEV",
        20 => "NFS3ERR_NOTDIR: not a directory",
        21 => "NFS3ERR_ISDIR: is a directory",
        22 => "NFS3ERR_INVAL: invalid argument",
        27 => "NFS3ERR_FBIG: file too large",
        28 => "NFS3ERR_NOSPC: no space left on the server",
        30 => "NFS3ERR_ROFS: read-only file system",
        63 => "NFS3ERR_NAMETOOLONG: name too long",
        66 => "NFS3ERR_NOTEMPTY: directory not empty",
        70 => "NFS3ERR_STALE: stale file handle",
        10001 => "NFS3ERR_BADHANDLE",
        10004 => "NFS3ERR_NOTSUPP",
        10006 => "NFS3ERR_SERVERFAULT",
        10008 => "NFS3ERR_JUKEBOX: try again later",
        _ => return format!("NFS status {s}"),
    };
    n.to_string()
}
