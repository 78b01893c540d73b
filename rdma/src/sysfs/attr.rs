//! Reading sysfs attribute files and parsing the formats the kernel prints.
//!
//! Parsers are pure functions over the text (unit-tested below); the readers
//! turn I/O and parse failures into [`Error::Sysfs`] naming the file.

use std::borrow::Cow;
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::device::Guid;
use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::port::LinkLayer;

/// Locks a cache mutex; a panic in another thread while it held the lock
/// leaves at worst a missing cache entry, so poisoning is ignored.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error for a file that could not be read.
pub(crate) fn unreadable(path: &Path, source: io::Error) -> Error {
    Error::Sysfs {
        path: path.to_path_buf(),
        problem: Cow::Borrowed("cannot read"),
        source: Some(source),
    }
}

/// The error for a file whose content is not what the kernel prints.
pub(crate) fn malformed(path: &Path, text: &str, expected: &str) -> Error {
    Error::Sysfs {
        path: path.to_path_buf(),
        problem: Cow::Owned(format!("malformed value {text:?}: expected {expected}")),
        source: None,
    }
}

/// Reads a file as UTF-8 without its trailing newline, keeping the I/O error
/// so callers can tell `ENOENT` or `EINVAL` apart.
pub(crate) fn read_raw(path: &Path) -> io::Result<String> {
    let bytes = std::fs::read(path)?;
    let mut text = String::from_utf8(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

/// Reads a file that must exist.
pub(crate) fn read(path: &Path) -> Result<String> {
    read_raw(path).map_err(|e| unreadable(path, e))
}

/// Reads a file that may be absent (`Ok(None)`).
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>> {
    match read_raw(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(unreadable(path, e)),
    }
}

/// Reads and parses a file that must exist.
pub(crate) fn read_parsed<T>(
    path: &Path,
    expected: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T> {
    let text = read(path)?;
    parse(&text).ok_or_else(|| malformed(path, &text, expected))
}

/// The numeric entries of a directory (`ports/`, `gids/`, `pkeys/`), sorted.
/// `Ok(None)` when the directory does not exist.
pub(crate) fn numbered_entries(dir: &Path) -> Result<Option<Vec<u32>>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        match parse_dec::<u32>(&name) {
            Some(n) => out.push(n),
            None => {
                return Err(malformed(
                    &entry.path(),
                    &name,
                    "a directory of numbered entries",
                ))
            }
        }
    }
    out.sort_unstable();
    Ok(Some(out))
}

/// The names in a directory (device names under `class/infiniband`), sorted.
pub(crate) fn names(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, e))?;
        let name = entry.file_name();
        match name.to_str() {
            Some(n) if !n.starts_with('.') => out.push(n.to_string()),
            Some(_) => {}
            None => {
                return Err(malformed(
                    &entry.path(),
                    &name.to_string_lossy(),
                    "a UTF-8 device name",
                ))
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// A decimal number, surrounding whitespace allowed.
pub(crate) fn parse_dec<T: std::str::FromStr>(text: &str) -> Option<T> {
    let t = text.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// A hexadecimal number as the kernel prints it (`0x1a`; the prefix is
/// optional).
pub(crate) fn parse_hex<T: TryFrom<u64>>(text: &str) -> Option<T> {
    let t = text.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16)
        .ok()
        .and_then(|v| T::try_from(v).ok())
}

/// `"4: ACTIVE"` → `(4, "ACTIVE")`: the value and the kernel's name for it.
pub(crate) fn parse_numbered<T: std::str::FromStr>(text: &str) -> Option<(T, &str)> {
    let (num, name) = text.split_once(':')?;
    let num = num.trim();
    let digits = num.strip_prefix('-').unwrap_or(num);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((num.parse().ok()?, name.trim()))
}

/// `N` hex groups separated by colons, each of 1 to 4 digits.
fn parse_hex_groups<const N: usize>(text: &str) -> Option<[u16; N]> {
    let mut out = [0u16; N];
    let mut parts = text.trim().split(':');
    for slot in &mut out {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 4 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        *slot = u16::from_str_radix(part, 16).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(out)
}

/// `xxxx:xxxx:xxxx:xxxx` (`node_guid`, `sys_image_guid`).
pub(crate) fn parse_guid(text: &str) -> Option<Guid> {
    let groups = parse_hex_groups::<4>(text)?;
    Some(Guid(
        groups
            .iter()
            .fold(0u64, |acc, g| (acc << 16) | u64::from(*g)),
    ))
}

/// Eight colon-separated groups (`gids/<i>`, printed with `%pI6`).
pub(crate) fn parse_gid(text: &str) -> Option<Gid> {
    let groups = parse_hex_groups::<8>(text)?;
    let mut raw = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        raw[2 * i..2 * i + 2].copy_from_slice(&g.to_be_bytes());
    }
    Some(Gid::from_raw(raw))
}

/// `link_layer`: `InfiniBand`, `Ethernet`, or `Unknown` (not reported).
pub(crate) fn parse_link_layer(text: &str) -> Option<LinkLayer> {
    match text.trim() {
        "InfiniBand" => Some(LinkLayer::InfiniBand),
        "Ethernet" => Some(LinkLayer::Ethernet),
        "Unknown" => Some(LinkLayer::Unspecified),
        _ => None,
    }
}

/// The `rate` file parsed: `"<n>[.5] Gb/sec (<w>X <speed>)"`.
pub(crate) struct ParsedRate {
    pub gbps: f64,
    pub lanes: Option<u32>,
    pub speed: Option<String>,
}

pub(crate) fn parse_rate(text: &str) -> Option<ParsedRate> {
    let mut words = text.split_whitespace();
    let number = words.next()?;
    if !number.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || !number.starts_with(|c: char| c.is_ascii_digit())
    {
        return None;
    }
    let gbps: f64 = number.parse().ok()?;
    if words.next()? != "Gb/sec" {
        return None;
    }
    let rest: Vec<&str> = words.collect();
    let (lanes, speed) = match rest.as_slice() {
        [] => (None, None),
        // "(4X EDR)"
        [width, speed] => {
            let lanes = width.strip_prefix('(')?.strip_suffix('X')?;
            let speed = speed.strip_suffix(')')?;
            (Some(parse_dec(lanes)?), Some(speed.to_string()))
        }
        // "(4X)"
        [width] => {
            let lanes = width.strip_prefix('(')?.strip_suffix("X)")?;
            (Some(parse_dec(lanes)?), None)
        }
        _ => return None,
    };
    Some(ParsedRate { gbps, lanes, speed })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_dec::<u8>("0"), Some(0));
        assert_eq!(parse_dec::<u8>(" 15 "), Some(15));
        assert_eq!(parse_dec::<u8>("256"), None);
        assert_eq!(parse_dec::<u8>("-1"), None);
        assert_eq!(parse_dec::<u8>(""), None);
        assert_eq!(parse_dec::<u8>("+1"), None);
        assert_eq!(parse_hex::<u16>("0x0"), Some(0));
        assert_eq!(parse_hex::<u16>("0xffff"), Some(0xffff));
        assert_eq!(parse_hex::<u16>("0x1ffff"), None);
        assert_eq!(parse_hex::<u16>("0x"), None);
        assert_eq!(parse_hex::<u16>("0xzz"), None);
        assert_eq!(parse_hex::<u32>("0x00010000"), Some(0x1_0000));
        assert_eq!(parse_hex::<u32>("0x00000000000000000001"), None);
    }

    #[test]
    fn numbered_values() {
        assert_eq!(parse_numbered::<u32>("4: ACTIVE"), Some((4, "ACTIVE")));
        assert_eq!(parse_numbered::<u8>("7: Phy Test"), Some((7, "Phy Test")));
        assert_eq!(parse_numbered::<i32>("1: CA"), Some((1, "CA")));
        assert_eq!(parse_numbered::<i32>("-1: x"), Some((-1, "x")));
        assert_eq!(parse_numbered::<u32>("ACTIVE"), None);
        assert_eq!(parse_numbered::<u32>(": ACTIVE"), None);
        assert_eq!(parse_numbered::<u32>("x4: ACTIVE"), None);
        assert_eq!(parse_numbered::<u32>("-1: x"), None);
    }

    #[test]
    fn guids_and_gids() {
        assert_eq!(
            parse_guid("0002:c903:0010:abcd"),
            Some(Guid(0x0002_c903_0010_abcd))
        );
        assert_eq!(parse_guid("0002:c903:0010"), None);
        assert_eq!(parse_guid("0002:c903:0010:abcd:0000"), None);
        assert_eq!(parse_guid("0002:c903:0010:abcde"), None);
        assert_eq!(parse_guid("0002:c903::abcd"), None);
        let gid = parse_gid("fe80:0000:0000:0000:0002:c903:0010:abcd").unwrap();
        assert_eq!(gid.subnet_prefix(), 0xfe80_0000_0000_0000);
        assert_eq!(gid.interface_id(), 0x0002_c903_0010_abcd);
        assert_eq!(gid.to_string(), "fe80:0000:0000:0000:0002:c903:0010:abcd");
        assert!(parse_gid("0000:0000:0000:0000:0000:0000:0000:0000")
            .unwrap()
            .is_zero());
        assert_eq!(parse_gid("fe80::1"), None);
        assert_eq!(parse_gid("fe80:0000:0000:0000:0002:c903:0010"), None);
    }

    #[test]
    fn rates() {
        let r = parse_rate("2.5 Gb/sec (1X SDR)").unwrap();
        assert_eq!(
            (r.gbps, r.lanes, r.speed.as_deref()),
            (2.5, Some(1), Some("SDR"))
        );
        let r = parse_rate("100 Gb/sec (4X EDR)").unwrap();
        assert_eq!(
            (r.gbps, r.lanes, r.speed.as_deref()),
            (100.0, Some(4), Some("EDR"))
        );
        let r = parse_rate("10 Gb/sec (4X)").unwrap();
        assert_eq!((r.gbps, r.lanes, r.speed), (10.0, Some(4), None));
        let r = parse_rate("40 Gb/sec").unwrap();
        assert_eq!((r.gbps, r.lanes), (40.0, None));
        assert!(parse_rate("fast").is_none());
        assert!(parse_rate("100 Mb/sec (4X EDR)").is_none());
        assert!(parse_rate("100").is_none());
        assert!(parse_rate("NaN Gb/sec").is_none());
        assert!(parse_rate("100 Gb/sec (4X EDR) extra").is_none());
    }

    #[test]
    fn link_layers() {
        assert_eq!(parse_link_layer("Ethernet"), Some(LinkLayer::Ethernet));
        assert_eq!(parse_link_layer("InfiniBand"), Some(LinkLayer::InfiniBand));
        assert_eq!(parse_link_layer("Unknown"), Some(LinkLayer::Unspecified));
        assert_eq!(parse_link_layer("Token Ring"), None);
    }
}
