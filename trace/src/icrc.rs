//! The RoCEv2 invariant CRC (ICRC): a CRC-32 (the Ethernet polynomial) over 8 bytes of ones
//! standing in for the InfiniBand LRH, the IP and UDP headers with their variant fields set to
//! ones, the BTH with its reserved byte set to ones, and the rest of the packet up to the ICRC,
//! which is carried least significant byte first.

/// The ICRC of a RoCEv2 packet. `ip` is the IP header (20 bytes for IPv4 without options, 40
/// for IPv6), `udp` the 8-byte UDP header, `ib` the UDP payload without its last 4 bytes (the
/// ICRC itself). `None` when a header is too short to mask.
pub fn compute(ip: &[u8], udp: &[u8], ib: &[u8]) -> Option<u32> {
    // The masked headers are gathered into one buffer and fed in one update: crc32fast
    // handles short inputs a byte at a time, and five short updates per packet were a sixth
    // of the ICRC's cost.
    let mut head = [0xffu8; 8 + 40 + 8 + 12];
    let mut n = 8;
    match ip.first().map(|b| b >> 4) {
        Some(4) => {
            let v4 = head.get_mut(n..n + 20)?;
            v4.copy_from_slice(ip.get(..20)?);
            v4[1] = 0xff; // type of service
            v4[8] = 0xff; // time to live
            v4[10] = 0xff; // header checksum
            v4[11] = 0xff;
            n += 20;
        }
        Some(6) => {
            let v6 = head.get_mut(n..n + 40)?;
            v6.copy_from_slice(ip.get(..40)?);
            v6[0] |= 0x0f; // traffic class and flow label
            v6[1] = 0xff;
            v6[2] = 0xff;
            v6[3] = 0xff;
            v6[7] = 0xff; // hop limit
            n += 40;
        }
        _ => return None,
    }
    // IPv4 options (rare) follow the fixed header unmasked, before the UDP header.
    let options = match ip.first().map(|b| b >> 4) {
        Some(4) => ip.get(20..)?,
        _ => &[],
    };
    let mut h = crc32fast::Hasher::new();
    if !options.is_empty() {
        h.update(head.get(..n)?);
        h.update(options);
        n = 0;
    }
    let u = head.get_mut(n..n + 8)?;
    u.copy_from_slice(udp.get(..8)?);
    u[6] = 0xff; // checksum
    u[7] = 0xff;
    let bth = head.get_mut(n + 8..n + 20)?;
    bth.copy_from_slice(ib.get(..12)?);
    bth[4] = 0xff; // reserved byte before the destination QP
    h.update(head.get(..n + 20)?);
    h.update(ib.get(12..)?);
    Some(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame holding a RoCEv2 ACK over IPv4 (hand-made: that the CRC itself matches
    /// rxe's is checked on real captures, `tests/fixtures.rs`).
    const ACK: [u8; 62] = [
        0x02, 0x5c, 0x1c, 0x3a, 0x5d, 0x8a, 0x5a, 0x0b, 0xc3, 0xd5, 0x22, 0x6e, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x30, 0x7b, 0x30, 0x40, 0x00, 0x40, 0x11, 0xab, 0x56, 0x0a, 0x08, 0x00, 0x02,
        0x0a, 0x08, 0x00, 0x01, 0xc0, 0x46, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, 0x11, 0x00, 0xff,
        0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x5a, 0x3b, 0x2c, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
        0x00, 0x00,
    ];

    /// The definition, spelled out: the masked bytes in one buffer, one CRC.
    fn by_definition(ip: &[u8], udp: &[u8], ib: &[u8]) -> u32 {
        let mut all = vec![0xff; 8];
        let mut ip = ip.to_vec();
        if ip[0] >> 4 == 4 {
            for i in [1, 8, 10, 11] {
                ip[i] = 0xff;
            }
        } else {
            ip[0] |= 0x0f;
            for i in [1, 2, 3, 7] {
                ip[i] = 0xff;
            }
        }
        all.extend_from_slice(&ip);
        all.extend_from_slice(&udp[..6]);
        all.extend_from_slice(&[0xff, 0xff]);
        let bth = all.len();
        all.extend_from_slice(ib);
        all[bth + 4] = 0xff;
        crc32fast::hash(&all)
    }

    #[test]
    fn ipv4_with_options_and_ipv6_give_the_crc_of_the_definition() {
        let udp = &ACK[34..42];
        let ib: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let v4 = ACK[14..34].to_vec();
        let mut v4opt = v4.clone();
        v4opt[0] = 0x47;
        v4opt.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let v6: Vec<u8> = (0..40u8).map(|i| if i == 0 { 0x6a } else { i }).collect();
        for ip in [&v4, &v4opt, &v6] {
            for len in [12, 16, 300] {
                assert_eq!(
                    compute(ip, udp, &ib[..len]),
                    Some(by_definition(ip, udp, &ib[..len])),
                    "ip header {} bytes, {len} bytes of IB",
                    ip.len()
                );
            }
        }
        assert_eq!(compute(&v4, udp, &ib[..11]), None);
    }

    #[test]
    fn masked_fields_do_not_change_the_crc() {
        let ip = &ACK[14..34];
        let udp = &ACK[34..42];
        let ib = &ACK[42..58];
        let a = compute(ip, udp, ib).unwrap();
        let mut ip2 = ip.to_vec();
        ip2[1] = 0x12;
        ip2[8] = 3;
        ip2[10] = 0;
        let mut udp2 = udp.to_vec();
        udp2[6] = 0x55;
        let mut ib2 = ib.to_vec();
        ib2[4] = 0x40;
        assert_eq!(compute(&ip2, &udp2, &ib2), Some(a));
        // A field that is not masked does change it.
        ib2[11] ^= 1;
        assert_ne!(compute(&ip2, &udp2, &ib2), Some(a));
        assert_eq!(compute(&ip[..10], udp, ib), None);
        assert_eq!(compute(&[0x50; 20], udp, ib), None);
    }
}
