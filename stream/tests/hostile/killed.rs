//! A peer process (our `rcat`) SIGKILLed mid-transfer: the blocking
//! stream's reader and writer end within the bound.

use super::*;

/// A child killed (SIGKILL) and reaped when the guard goes, whatever
/// happened.
pub(super) struct Killed(pub(super) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Bytes before the kill the stream side waits for.
pub(super) const BEFORE_KILL: usize = 1 << 20;

/// `rcat ADDR PORT` sends the test pattern to our listener; once the
/// stream read a megabyte it is SIGKILLed; the reader must see an error or
/// the end within `BOUND`, having read a prefix of the pattern.
fn killed_sender(dev: &str, port: u16) {
    let a = addr(dev, port);
    let l = RdmaListener::bind(a).expect("bind");
    let (mid_tx, mid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().expect("accept rcat");
        let mut buf = vec![0; 64 * 1024];
        let mut n = 0usize;
        let mut wrong = None;
        let mut told = false;
        let end = loop {
            match (&s).read(&mut buf) {
                Ok(0) => break End::Eof,
                Ok(k) => {
                    if wrong.is_none() {
                        wrong = (0..k).find(|&i| buf[i] != pattern(n + i)).map(|i| n + i);
                    }
                    n += k;
                    if n >= BEFORE_KILL && !told {
                        told = true;
                        let _ = mid_tx.send(());
                    }
                }
                Err(e) => break End::Err(e.kind(), e.to_string()),
            }
        };
        let _ = tx.send((n, wrong, end, Instant::now()));
    });
    let mut child = Command::new(example("rcat"))
        .args([&ip(dev), &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rcat");
    let mut stdin = child.stdin.take().unwrap();
    let child = Killed(child);
    let feeder = thread::spawn(move || {
        let mut at = 0usize;
        loop {
            let chunk = patterned(at, 64 * 1024);
            if stdin.write_all(&chunk).is_err() {
                break;
            }
            at += chunk.len();
        }
    });
    mid_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the stream read a megabyte from rcat");
    let mut child = child;
    child.0.kill().expect("SIGKILL rcat");
    let t0 = Instant::now();
    let (n, wrong, end, at) = outcome(&rx, h, "rcat SIGKILLed while sending");
    let took = at.saturating_duration_since(t0);
    println!(
        "{dev} rcat SIGKILLed while sending: read {n} bytes, then {end:?} {took:?} after the kill"
    );
    drop(child);
    let _ = feeder.join();
    assert_eq!(wrong, None, "byte {wrong:?} is not what rcat sent");
    assert!(n >= BEFORE_KILL);
    assert!(took < BOUND);
    assert!(
        matches!(
            &end,
            End::Eof
                | End::Err(
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted,
                    _
                )
        ),
        "{end:?}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_reader_ends_when_the_sender_is_sigkilled_rxe() {
    killed_sender("rxe", 7633);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_reader_ends_when_the_sender_is_sigkilled_iwarp() {
    killed_sender("siw", 7634);
}

/// `rcat -l` takes what our stream writes; once a megabyte went it is
/// SIGKILLed; the writer must fail within `BOUND`.
fn killed_receiver(dev: &str, port: u16) {
    let mut child = Command::new(example("rcat"))
        .args(["-v", "-l", &ip(dev), &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rcat -l");
    let mut line = String::new();
    let got = BufReader::new(child.stderr.as_mut().unwrap()).read_line(&mut line);
    let mut child = Killed(child);
    assert!(matches!(got, Ok(n) if n > 0), "rcat -l did not listen");
    let dst = addr(dev, port);
    let (mid_tx, mid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let s = RdmaStream::connect(dst).expect("connect to rcat -l");
        let mut n = 0usize;
        let mut told = false;
        let err = loop {
            let chunk = patterned(n, 64 * 1024);
            match (&s).write(&chunk) {
                Ok(k) => n += k,
                Err(e) => break e,
            }
            if n >= BEFORE_KILL && !told {
                told = true;
                let _ = mid_tx.send(());
            }
        };
        let _ = tx.send((n, err.kind(), err.to_string(), Instant::now()));
        drop(s);
    });
    mid_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the stream wrote a megabyte to rcat -l");
    child.0.kill().expect("SIGKILL rcat -l");
    let t0 = Instant::now();
    let (n, kind, msg, at) = outcome(&rx, h, "rcat -l SIGKILLed while receiving");
    let took = at.saturating_duration_since(t0);
    println!(
        "{dev} rcat -l SIGKILLed while receiving: wrote {n} bytes, then {kind:?} ({msg}) \
         {took:?} after the kill"
    );
    assert!(took < BOUND);
    assert!(
        matches!(
            kind,
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted
        ),
        "{kind:?}: {msg}"
    );
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_writer_fails_when_the_receiver_is_sigkilled_rxe() {
    killed_receiver("rxe", 7635);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_writer_fails_when_the_receiver_is_sigkilled_iwarp() {
    killed_receiver("siw", 7636);
}
