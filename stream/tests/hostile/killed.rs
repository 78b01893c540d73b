//! A peer process (our `rcat`) SIGKILLed mid-transfer: the blocking
//! stream's reader and writer end within the bound. Also the setup of that
//! peer process and the checks of its end, which the async stream's tests
//! (`aio`) share.

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

/// `rcat ADDR PORT` on `dev`, sending to a listener there: the child, and
/// the thread that feeds it the test pattern until it is gone.
pub(super) fn rcat_sending(dev: &str, port: u16) -> (Killed, thread::JoinHandle<()>) {
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
    (child, feeder)
}

/// `rcat -v -l ADDR PORT` on `dev`, once it listens (it says so on its
/// standard error), and the address it listens on.
pub(super) fn rcat_listening(dev: &str, port: u16) -> (Killed, SocketAddr) {
    let mut child = Command::new(example("rcat"))
        .args(["-v", "-l", &ip(dev), &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rcat -l");
    let mut line = String::new();
    let got = BufReader::new(child.stderr.as_mut().unwrap()).read_line(&mut line);
    let child = Killed(child);
    assert!(matches!(got, Ok(n) if n > 0), "rcat -l did not listen");
    (child, addr(dev, port))
}

/// The stream side's count of the bytes it moved: it says once, through
/// `mid`, that `BEFORE_KILL` went, and a reader also notes the first byte
/// that is not the pattern's.
pub(super) struct Tally {
    pub(super) n: usize,
    pub(super) wrong: Option<usize>,
    told: bool,
    mid: mpsc::Sender<()>,
}

impl Tally {
    pub(super) fn new(mid: mpsc::Sender<()>) -> Tally {
        Tally {
            n: 0,
            wrong: None,
            told: false,
            mid,
        }
    }

    /// Counts `got`, the next bytes read, checked against the pattern.
    pub(super) fn read(&mut self, got: &[u8]) {
        if self.wrong.is_none() {
            let n = self.n;
            self.wrong = (0..got.len())
                .find(|&i| got[i] != pattern(n + i))
                .map(|i| n + i);
        }
        self.wrote(got.len());
    }

    /// Counts `k` more bytes moved.
    pub(super) fn wrote(&mut self, k: usize) {
        self.n += k;
        if self.n >= BEFORE_KILL && !self.told {
            self.told = true;
            let _ = self.mid.send(());
        }
    }
}

/// Waits until the stream side moved a megabyte (`moved` says which, if it
/// never does), SIGKILLs `child` (`kill` says which, if that fails) and
/// returns when.
pub(super) fn kill_after_a_megabyte(
    child: &mut Killed,
    mid: &mpsc::Receiver<()>,
    moved: &str,
    kill: &str,
) -> Instant {
    mid.recv_timeout(Duration::from_secs(60)).expect(moved);
    child.0.kill().expect(kill);
    Instant::now()
}

/// A reader whose sender was killed sees the end of the stream or a reset.
pub(super) fn assert_reader_ended(end: &End) {
    assert!(
        matches!(
            end,
            End::Eof
                | End::Err(
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted,
                    _
                )
        ),
        "{end:?}"
    );
}

/// A writer whose receiver was killed fails with a reset or a broken pipe.
pub(super) fn assert_writer_failed(kind: io::ErrorKind, msg: &str) {
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

/// `rcat ADDR PORT` sends the test pattern to our listener; once the
/// stream read a megabyte it is SIGKILLed; the reader must see an error or
/// the end within `BOUND`, having read a prefix of the pattern.
/// With `nonblocking`, the reader spins on `WouldBlock` as a non-blocking
/// caller does (it never sleeps in the stream).
fn killed_sender(dev: &str, port: u16, nonblocking: bool) {
    let a = addr(dev, port);
    let l = RdmaListener::bind(a).expect("bind");
    let (mid_tx, mid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let (s, _) = l.accept().expect("accept rcat");
        s.set_nonblocking(nonblocking).expect("set_nonblocking");
        let mut buf = vec![0; 64 * 1024];
        let mut tally = Tally::new(mid_tx);
        let end = loop {
            match (&s).read(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                r => match End::of(r) {
                    Ok(k) => tally.read(&buf[..k]),
                    Err(end) => break end,
                },
            }
        };
        let _ = tx.send((tally.n, tally.wrong, end, Instant::now()));
    });
    let (mut child, feeder) = rcat_sending(dev, port);
    let t0 = kill_after_a_megabyte(
        &mut child,
        &mid_rx,
        "the stream read a megabyte from rcat",
        "SIGKILL rcat",
    );
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
    assert_reader_ended(&end);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_reader_ends_when_the_sender_is_sigkilled_rxe() {
    killed_sender("rxe", 7633, false);
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_reader_ends_when_the_sender_is_sigkilled_iwarp() {
    killed_sender("siw", 7634, false);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_nonblocking_reader_ends_when_the_sender_is_sigkilled_rxe() {
    killed_sender("rxe", 7690, true);
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_nonblocking_reader_ends_when_the_sender_is_sigkilled_iwarp() {
    killed_sender("siw", 7691, true);
}

/// `rcat -l` takes what our stream writes; once a megabyte went it is
/// SIGKILLed; the writer must fail within `BOUND`.
fn killed_receiver(dev: &str, port: u16) {
    let (mut child, dst) = rcat_listening(dev, port);
    let (mid_tx, mid_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let h = thread::spawn(move || {
        let s = RdmaStream::connect(dst).expect("connect to rcat -l");
        let mut tally = Tally::new(mid_tx);
        let err = loop {
            let chunk = patterned(tally.n, 64 * 1024);
            match (&s).write(&chunk) {
                Ok(k) => tally.wrote(k),
                Err(e) => break e,
            }
        };
        let _ = tx.send((tally.n, err.kind(), err.to_string(), Instant::now()));
        drop(s);
    });
    let t0 = kill_after_a_megabyte(
        &mut child,
        &mid_rx,
        "the stream wrote a megabyte to rcat -l",
        "SIGKILL rcat -l",
    );
    let (n, kind, msg, at) = outcome(&rx, h, "rcat -l SIGKILLed while receiving");
    let took = at.saturating_duration_since(t0);
    println!(
        "{dev} rcat -l SIGKILLed while receiving: wrote {n} bytes, then {kind:?} ({msg}) \
         {took:?} after the kill"
    );
    assert!(took < BOUND);
    assert_writer_failed(kind, &msg);
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
