//! Which network interface carries a rank's address: what tells the rails of a host apart
//! when it has several NICs (ranks bound to different interfaces do not share a link between
//! hosts). Linux names it in its routing table: the most specific route without a gateway
//! whose destination covers the address (`/proc/net/route`, IPv4). Loopback is `lo`; an
//! unspecified or IPv6 address, or a system without that table, is unknown (`None`), and the
//! ranks of a host are then taken to share one link.

use std::net::{IpAddr, Ipv4Addr};

/// The interface that carries `ip` on this machine (in this network namespace).
pub fn interface_of(ip: IpAddr) -> Option<String> {
    match ip {
        _ if ip.is_loopback() => Some("lo".into()),
        IpAddr::V4(v4) if !v4.is_unspecified() => std::fs::read_to_string("/proc/net/route")
            .ok()
            .and_then(|table| route_interface(&table, v4)),
        _ => None,
    }
}

/// The interface of the most specific directly connected route of `table` (the text of
/// `/proc/net/route`: a header, then one route per line, addresses as the kernel's
/// native-order hex) that covers `ip`. Lines that do not parse are skipped.
pub fn route_interface(table: &str, ip: Ipv4Addr) -> Option<String> {
    let address = u32::from_ne_bytes(ip.octets());
    let hex = |field: &str| u32::from_str_radix(field, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (iface, dest, gateway, mask) = (
                fields.first()?,
                hex(fields.get(1)?)?,
                hex(fields.get(2)?)?,
                hex(fields.get(7)?)?,
            );
            (gateway == 0 && address & mask == dest & mask)
                .then(|| (mask.count_ones(), iface.to_string()))
        })
        .max_by_key(|(bits, _)| *bits)
        .map(|(_, iface)| iface)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with a default route via eth0, 192.0.2.0/24 on eth0 and 10.79.0.0/24 on nic1,
    /// 10.79.0.128/25 on nic2 (addresses in native order, as the kernel prints them).
    fn table() -> String {
        let row = |iface: &str, dest: [u8; 4], gw: [u8; 4], mask: [u8; 4]| {
            format!(
                "{iface}\t{:08X}\t{:08X}\t0003\t0\t0\t0\t{:08X}\t0\t0\t0\n",
                u32::from_ne_bytes(dest),
                u32::from_ne_bytes(gw),
                u32::from_ne_bytes(mask)
            )
        };
        let mut t = String::from(
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n",
        );
        t += &row("eth0", [0, 0, 0, 0], [192, 0, 2, 1], [0, 0, 0, 0]);
        t += &row("eth0", [192, 0, 2, 0], [0; 4], [255, 255, 255, 0]);
        t += &row("nic1", [10, 79, 0, 0], [0; 4], [255, 255, 255, 0]);
        t += &row("nic2", [10, 79, 0, 128], [0; 4], [255, 255, 255, 128]);
        t += "garbage line\n";
        t
    }

    #[test]
    fn the_most_specific_connected_route_names_the_interface() {
        let t = table();
        let at = |a, b, c, d| route_interface(&t, Ipv4Addr::new(a, b, c, d));
        assert_eq!(at(192, 0, 2, 7).as_deref(), Some("eth0"));
        assert_eq!(at(10, 79, 0, 5).as_deref(), Some("nic1"));
        assert_eq!(at(10, 79, 0, 200).as_deref(), Some("nic2"));
        // Only the default route (through a gateway) covers it: not a local interface.
        assert_eq!(at(198, 51, 100, 1), None);
        assert_eq!(route_interface("", Ipv4Addr::new(10, 79, 0, 5)), None);
    }

    #[test]
    fn loopback_and_unspecified() {
        assert_eq!(
            interface_of(IpAddr::V4(Ipv4Addr::LOCALHOST)).as_deref(),
            Some("lo")
        );
        assert_eq!(interface_of(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), None);
    }
}
