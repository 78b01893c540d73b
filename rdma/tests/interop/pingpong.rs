//! The RC, UC and UD pingpong examples against `ibv_rc_pingpong`,
//! `ibv_uc_pingpong` and `ibv_ud_pingpong`, each way round and against
//! themselves, with `-c`, `-e` and the new send API where the tools have them.

use super::*;

// RC

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18701).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18702).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_rust_server_rust_client() {
    Run::new(Rc, Rust, Rust, 18703).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_chk_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18704).flags(&["-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_chk_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18705).flags(&["-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_events_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18706).flags(&["-e"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_events_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18707).flags(&["-e"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_events_chk_rust_server_rust_client() {
    Run::new(Rc, Rust, Rust, 18708)
        .flags(&["-e", "-c", "-s", "3000", "-r", "8"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_new_send_rust_server_c_client() {
    Run::new(Rc, Rust, C, 18709).flags(&["-N", "-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn rc_new_send_c_server_rust_client() {
    Run::new(Rc, C, Rust, 18710).flags(&["-N", "-c"]).check();
}

// UC

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn uc_rust_server_c_client() {
    Run::new(Uc, Rust, C, 18711).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn uc_c_server_rust_client() {
    Run::new(Uc, C, Rust, 18712).flags(&["-c"]).check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn uc_rust_server_rust_client() {
    Run::new(Uc, Rust, Rust, 18713).flags(&["-e", "-c"]).check();
}

// UD: one message is one packet, so the size must fit the active MTU.

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_rust_server_c_client() {
    Run::new(Ud, Rust, C, 18721)
        .flags(&["-s", "1024", "-c"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_c_server_rust_client() {
    Run::new(Ud, C, Rust, 18722)
        .flags(&["-s", "1024", "-c"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_rust_server_rust_client() {
    Run::new(Ud, Rust, Rust, 18723)
        .flags(&["-s", "1024", "-e", "-c"])
        .check();
}

#[test]
#[ignore = "needs an RDMA device (RDMA_TEST_DEVICE)"]
fn ud_c_server_rust_client_default_size() {
    Run::new(Ud, C, Rust, 18724).check();
}
