//! Prints the RDMA devices and their ports, like rdma-core's `ibv_devinfo`.
//!
//! ```text
//! devinfo [-d DEVICE] [-i PORT] [-l] [-v] [--sysfs]
//!   -d, --ib-dev=DEVICE   only this device
//!   -i, --ib-port=PORT    only this port
//!   -l, --list            only list the device names
//!   -v, --verbose         every attribute, and the GID table
//!       --sysfs           read /sys/class/infiniband only, without opening
//!                         a verbs context (rdma::sysfs)
//! ```

mod common;

use std::process::ExitCode;

use common::args::{ArgError, Cli, Flag, Parsed};
use rdma::sysfs::{RdmaDevice, Sysfs};
use rdma::{Context, Device};

struct Args {
    device: Option<String>,
    port: Option<u32>,
    list: bool,
    verbose: bool,
    sysfs: bool,
}

#[derive(Debug, Clone, Copy)]
enum Key {
    Device,
    Port,
    List,
    Verbose,
    Sysfs,
}

const CLI: Cli<'static, Key> = Cli {
    name: "devinfo",
    usage: "  devinfo [-d DEVICE] [-i PORT] [-l] [-v] [--sysfs]",
    flags: &[
        Flag::value(Key::Device, 'd', "ib-dev", "DEVICE", "only this device"),
        Flag::value(Key::Port, 'i', "ib-port", "PORT", "only this port"),
        Flag::switch(Key::List, 'l', "list", "only list the device names"),
        Flag::switch(
            Key::Verbose,
            'v',
            "verbose",
            "every attribute, and the GID table",
        ),
        Flag {
            key: Key::Sysfs,
            short: None,
            long: "sysfs",
            value: None,
            help: "read /sys/class/infiniband only, without opening a verbs context (rdma::sysfs)",
        },
    ],
    bad_exit: 2,
};

fn parse_args(parsed: Parsed<Key>) -> Result<Args, ArgError> {
    parsed.no_operands()?;
    let mut args = Args {
        device: None,
        port: None,
        list: false,
        verbose: false,
        sysfs: false,
    };
    for f in parsed.flags {
        match f.key {
            Key::Device => args.device = Some(f.value),
            Key::Port => args.port = Some(f.number("a port number")?),
            Key::List => args.list = true,
            Key::Verbose => args.verbose = true,
            Key::Sysfs => args.sysfs = true,
        }
    }
    Ok(args)
}

fn print_device(dev: &Device, args: &Args) -> rdma::Result<()> {
    let ctx = dev.open()?;
    let attr = ctx.query_device()?;
    println!("hca_id:\t{}", dev.name());
    println!(
        "\ttransport:\t\t\t{} ({})",
        dev.transport_type(),
        dev.transport_type().to_raw()
    );
    println!("\tfw_ver:\t\t\t\t{}", attr.fw_ver());
    println!("\tnode_guid:\t\t\t{}", attr.node_guid());
    println!("\tsys_image_guid:\t\t\t{}", attr.sys_image_guid());
    println!("\tvendor_id:\t\t\t0x{:04x}", attr.vendor_id());
    println!("\tvendor_part_id:\t\t\t{}", attr.vendor_part_id());
    println!("\thw_ver:\t\t\t\t0x{:X}", attr.hw_ver());
    println!("\tphys_port_cnt:\t\t\t{}", attr.phys_port_cnt());
    if args.verbose {
        println!("\tmax_mr_size:\t\t\t0x{:x}", attr.max_mr_size());
        println!("\tpage_size_cap:\t\t\t0x{:x}", attr.page_size_cap());
        for (name, v) in [
            ("max_qp", attr.max_qp()),
            ("max_qp_wr", attr.max_qp_wr()),
            ("max_sge", attr.max_sge()),
            ("max_sge_rd", attr.max_sge_rd()),
            ("max_cq", attr.max_cq()),
            ("max_cqe", attr.max_cqe()),
            ("max_mr", attr.max_mr()),
            ("max_pd", attr.max_pd()),
            ("max_qp_rd_atom", attr.max_qp_rd_atom()),
            ("max_qp_init_rd_atom", attr.max_qp_init_rd_atom()),
            ("max_res_rd_atom", attr.max_res_rd_atom()),
            ("max_mw", attr.max_mw()),
            ("max_mcast_grp", attr.max_mcast_grp()),
            ("max_mcast_qp_attach", attr.max_mcast_qp_attach()),
            (
                "max_total_mcast_qp_attach",
                attr.max_total_mcast_qp_attach(),
            ),
            ("max_ah", attr.max_ah()),
            ("max_srq", attr.max_srq()),
            ("max_srq_wr", attr.max_srq_wr()),
            ("max_srq_sge", attr.max_srq_sge()),
        ] {
            println!("\t{name}:{}{v}", tabs(name));
        }
        println!(
            "\tdevice_cap_flags:\t\t0x{:08x} {:?}",
            attr.device_cap_flags().bits(),
            attr.device_cap_flags()
        );
        println!(
            "\tatomic_cap:\t\t\t{:?} ({})",
            attr.atomic_cap(),
            attr.atomic_cap().to_raw()
        );
        println!("\tmax_pkeys:\t\t\t{}", attr.max_pkeys());
        println!("\tlocal_ca_ack_delay:\t\t{}", attr.local_ca_ack_delay());
        println!("\tnum_comp_vectors:\t\t{}", ctx.num_comp_vectors());
    }
    for port in 1..=u32::from(ctx.port_count()) {
        if args.port.is_some_and(|p| p != port) {
            continue;
        }
        print_port(&ctx, port, args.verbose)?;
    }
    if let Some(p) = args.port {
        // An explicit bad port gets the crate's error, as ibv_devinfo fails too.
        ctx.query_port(p)?;
    }
    Ok(())
}

fn tabs(name: &str) -> &'static str {
    match name.len() + 2 {
        0..=7 => "\t\t\t\t",
        8..=15 => "\t\t\t",
        16..=23 => "\t\t",
        _ => "\t",
    }
}

fn print_port(ctx: &Context, port: u32, verbose: bool) -> rdma::Result<()> {
    let p = ctx.query_port(port)?;
    let mtu = |m: rdma::Mtu| {
        m.bytes().map_or_else(
            || format!("unknown ({})", m.to_raw()),
            |b| format!("{b} ({})", m.to_raw()),
        )
    };
    println!("\t\tport:\t{port}");
    println!("\t\t\tstate:\t\t\t{} ({})", p.state, p.state.to_raw());
    println!("\t\t\tmax_mtu:\t\t{}", mtu(p.max_mtu));
    println!("\t\t\tactive_mtu:\t\t{}", mtu(p.active_mtu));
    println!("\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
    println!("\t\t\tport_lid:\t\t{}", p.lid);
    println!("\t\t\tport_lmc:\t\t0x{:02x}", p.lmc);
    println!("\t\t\tlink_layer:\t\t{}", p.link_layer);
    if verbose {
        println!("\t\t\tmax_msg_sz:\t\t0x{:x}", p.max_msg_sz);
        println!("\t\t\tport_cap_flags:\t\t0x{:08x}", p.port_cap_flags.bits());
        println!("\t\t\tport_cap_flags2:\t0x{:04x}", p.port_cap_flags2);
        println!("\t\t\tmax_vl_num:\t\t{}", p.max_vl_num);
        println!("\t\t\tbad_pkey_cntr:\t\t0x{:x}", p.bad_pkey_cntr);
        println!("\t\t\tqkey_viol_cntr:\t\t0x{:x}", p.qkey_viol_cntr);
        println!("\t\t\tsm_sl:\t\t\t{}", p.sm_sl);
        println!("\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
        println!("\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
        match (p.width_lanes(), p.lane_speed()) {
            (Some(w), Some((_, name))) => {
                println!("\t\t\tactive_width:\t\t{w}X ({})", p.active_width);
                println!("\t\t\tactive_speed:\t\t{name} ({})", p.active_speed);
            }
            _ => {
                println!("\t\t\tactive_width:\t\tinvalid ({})", p.active_width);
                println!("\t\t\tactive_speed:\t\tinvalid ({})", p.active_speed);
            }
        }
        if let Some(rate) = p.rate_gbps() {
            println!("\t\t\trate:\t\t\t{rate} Gb/sec");
        }
        println!("\t\t\tphys_state:\t\t{}", p.phys_state);
        for e in ctx.query_gid_table()?.iter().filter(|e| e.port == port) {
            println!(
                "\t\t\tGID[{:3}]:\t\t{}, {}{}",
                e.index,
                e.gid,
                e.gid_type,
                e.netdev_name()
                    .map(|n| format!(", {n}"))
                    .unwrap_or_default()
            );
        }
    }
    println!();
    Ok(())
}

fn print_sysfs_device(dev: &RdmaDevice, args: &Args) -> rdma::Result<()> {
    let transport = dev.transport_type()?;
    println!("hca_id:\t{}", dev.name());
    println!("\ttransport:\t\t\t{transport} ({})", transport.to_raw());
    let fw = dev.fw_ver()?;
    println!("\tfw_ver:\t\t\t\t{}", fw.as_deref().unwrap_or("(none)"));
    println!("\tnode_guid:\t\t\t{}", dev.node_guid()?);
    println!("\tsys_image_guid:\t\t\t{}", dev.sys_image_guid()?);
    for (name, value) in [
        ("hw_rev", dev.hw_rev()?),
        ("hca_type", dev.hca_type()?),
        ("board_id", dev.board_id()?),
    ] {
        if let Some(v) = value {
            println!("\t{name}:{}{v}", tabs(name));
        }
    }
    println!("\tphys_port_cnt:\t\t\t{}", dev.phys_port_count()?);
    if args.verbose {
        println!("\tnode_type:\t\t\t{}", dev.node_type()?);
        println!("\tnode_desc:\t\t\t{}", dev.node_desc()?);
    }
    let ports = dev.end_ports()?;
    if let Some(p) = args.port {
        // An explicit bad port is an error naming the ports that exist.
        dev.end_port(p)?;
    }
    for port in ports {
        if args.port.is_some_and(|p| p != port.port_num()) {
            continue;
        }
        print_sysfs_port(&port, args.verbose)?;
    }
    Ok(())
}

fn print_sysfs_port(port: &rdma::sysfs::EndPort, verbose: bool) -> rdma::Result<()> {
    let state = port.state()?;
    println!("\t\tport:\t{}", port.port_num());
    println!("\t\t\tstate:\t\t\t{state} ({})", state.to_raw());
    // LIDs exist on InfiniBand-transport ports only (not iWARP).
    if let Some(sm_lid) = port.sm_lid()? {
        println!("\t\t\tsm_lid:\t\t\t{sm_lid}");
    }
    if let Some(lid) = port.lid()? {
        println!("\t\t\tport_lid:\t\t{lid}");
    }
    if let Some(lmc) = port.lmc()? {
        println!("\t\t\tport_lmc:\t\t0x{lmc:02x}");
    }
    println!("\t\t\tlink_layer:\t\t{}", port.link_layer()?);
    if verbose {
        println!("\t\t\tport_cap_flags:\t\t0x{:08x}", port.cap_mask()?.bits());
        if let Some(sm_sl) = port.sm_sl()? {
            println!("\t\t\tsm_sl:\t\t\t{sm_sl}");
        }
        if let Some(t) = port.subnet_timeout()? {
            println!("\t\t\tsubnet_timeout:\t\t{t}");
        }
        if let Some(guid) = port.port_guid()? {
            println!("\t\t\tport_guid:\t\t{guid}");
        }
        println!("\t\t\tgid_tbl_len:\t\t{}", port.gids().len()?);
        if let Some(pkeys) = port.pkeys()? {
            println!("\t\t\tpkey_tbl_len:\t\t{}", pkeys.len()?);
        }
        println!("\t\t\trate:\t\t\t{}", port.rate()?);
        let phys = port.phys_state()?;
        println!("\t\t\tphys_state:\t\t{phys} ({})", phys.to_raw());
        for entry in port.gids().iter() {
            let (index, gid) = entry?;
            let gid_type = port
                .gid_type(index)?
                .map(|t| format!(", {t}"))
                .unwrap_or_default();
            let netdev = port
                .gid_netdev(index)?
                .map(|n| format!(", {n}"))
                .unwrap_or_default();
            println!("\t\t\tGID[{index:3}]:\t\t{gid}{gid_type}{netdev}");
        }
        if let Some(pkeys) = port.pkeys()? {
            for entry in pkeys.iter() {
                let (index, pkey) = entry?;
                println!("\t\t\tPKey[{index:3}]:\t\t0x{pkey:04x}");
            }
        }
    }
    println!();
    Ok(())
}

/// `--sysfs`: the same report from `/sys/class/infiniband` alone.
fn main_sysfs(args: &Args) -> ExitCode {
    let sysfs = Sysfs::system();
    let devices = match &args.device {
        Some(name) => sysfs.device(name).map(|d| vec![d]),
        None => sysfs.devices(),
    };
    let devices = match devices {
        Ok(d) => d,
        Err(e) => {
            eprintln!("devinfo: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.list {
        println!(
            "{} HCA{} found:",
            devices.len(),
            if devices.len() == 1 { "" } else { "s" }
        );
        for d in &devices {
            println!("\t{}", d.name());
        }
        return ExitCode::SUCCESS;
    }
    if devices.is_empty() {
        println!("No IB devices found");
    }
    let mut status = ExitCode::SUCCESS;
    for d in &devices {
        if let Err(e) = print_sysfs_device(d, args) {
            eprintln!("devinfo: {}: {e}", d.name());
            status = ExitCode::FAILURE;
        }
    }
    status
}

fn main() -> ExitCode {
    let args = match CLI.read(parse_args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if args.sysfs {
        return main_sysfs(&args);
    }
    let devices = match rdma::devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("devinfo: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.list {
        println!(
            "{} HCA{} found:",
            devices.len(),
            if devices.len() == 1 { "" } else { "s" }
        );
        for d in &devices {
            println!("\t{}", d.name());
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<&Device> = match &args.device {
        Some(name) => match devices.iter().find(|d| d.name() == name) {
            Some(d) => vec![d],
            None => {
                match rdma::device_by_name(name) {
                    Err(e) => eprintln!("devinfo: {e}"),
                    Ok(_) => eprintln!("devinfo: device {name} vanished"),
                }
                return ExitCode::FAILURE;
            }
        },
        None => devices.iter().collect(),
    };
    if selected.is_empty() {
        println!("No IB devices found");
    }
    let mut status = ExitCode::SUCCESS;
    for d in selected {
        if let Err(e) = print_device(d, &args) {
            eprintln!("devinfo: {}: {e}", d.name());
            status = ExitCode::FAILURE;
        }
    }
    status
}
