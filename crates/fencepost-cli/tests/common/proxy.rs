//! A TCP proxy in front of PostgreSQL that fails as a restarting server or pooler does: it
//! refuses logins for a while (PgBouncer's `server_login_retry`: `08P01` "server login has been
//! failing, try again later"), cuts every connection, or loses one simple query (before the
//! server sees it) or one answer (after the server ran it). It reads the protocol's framing only: the startup
//! packet, then typed messages.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does with the connections and queries it sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards everything.
    Pass,
    /// Answers every login with PgBouncer's `08P01` "server login has been failing".
    RefuseLogins,
    /// The `n`-th simple query (`Q`) from now never reaches the server: its connection is
    /// closed.
    DropQuery(u64),
    /// The `n`-th simple query from now reaches the server, which runs it, but its answer is lost:
    /// the connection is closed after the server had time to run it.
    DropAnswer(u64),
}

struct State {
    mode: Mutex<Mode>,
    /// Queries seen since the mode was set.
    queries: AtomicU64,
    /// Every connection's sockets, to cut them.
    open: Mutex<Vec<TcpStream>>,
}

/// The proxy; it listens until the test ends.
pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`), forwarding.
    pub fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            mode: Mutex::new(Mode::Pass),
            queries: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
        });
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                let upstream = upstream.clone();
                std::thread::spawn(move || serve(client, &upstream, &state));
            }
        });
        Self { port, state }
    }

    /// Sets the mode; the query count starts over.
    pub fn set(&self, mode: Mode) {
        self.state.queries.store(0, Ordering::SeqCst);
        *self.state.mode.lock().unwrap() = mode;
    }

    /// Closes every open connection (a restart), keeping the mode.
    pub fn cut(&self) {
        for stream in self.state.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// The queries seen since the mode was last set.
    pub fn queries(&self) -> u64 {
        self.state.queries.load(Ordering::SeqCst)
    }

    /// `url` (a `postgres://` URL) through this proxy.
    pub fn url(&self, url: &str) -> String {
        let (scheme_user, rest) = url.split_once('@').expect("a URL with credentials");
        let path = rest.split_once('/').map_or("", |(_, path)| path);
        format!("{scheme_user}@127.0.0.1:{}/{path}", self.port)
    }
}

/// PgBouncer's answer to a login while its server's logins fail.
fn login_refusal() -> Vec<u8> {
    let mut fields = Vec::new();
    for (kind, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "08P01"),
        (
            b'M',
            "server login has been failing, try again later (server_login_retry)",
        ),
    ] {
        fields.push(kind);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut message = vec![b'E'];
    message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(&fields);
    message
}

fn serve(mut client: TcpStream, upstream: &str, state: &State) {
    let _ = client.set_nodelay(true);
    // The startup phase: SSL/GSS requests, then the startup message.
    let server = loop {
        let Some(packet) = read_untyped(&mut client) else {
            return;
        };
        let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
        if code == 80_877_103 || code == 80_877_104 {
            let _ = client.write_all(b"N"); // no TLS, no GSS
            continue;
        }
        if *state.mode.lock().unwrap() == Mode::RefuseLogins {
            let _ = client.write_all(&login_refusal());
            return;
        }
        let Ok(mut upstream) = TcpStream::connect(upstream) else {
            return;
        };
        let _ = upstream.set_nodelay(true);
        if upstream.write_all(&packet).is_err() {
            return;
        }
        break upstream;
    };
    {
        let mut open = state.open.lock().unwrap();
        open.push(client.try_clone().unwrap());
        open.push(server.try_clone().unwrap());
    }
    let muted = Arc::new(AtomicBool::new(false));
    let answers = {
        let (mut from, mut to) = (server.try_clone().unwrap(), client.try_clone().unwrap());
        let muted = Arc::clone(&muted);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 16 * 1024];
            loop {
                match from.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(read) if !muted.load(Ordering::SeqCst) => {
                        if to.write_all(&buffer[..read]).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {} // lost
                }
            }
            let _ = to.shutdown(Shutdown::Both);
        })
    };
    let mut to_server = server.try_clone().unwrap();
    while let Some(message) = read_typed(&mut client) {
        if message[0] == b'Q' {
            let seen = state.queries.fetch_add(1, Ordering::SeqCst) + 1;
            match *state.mode.lock().unwrap() {
                Mode::DropQuery(n) if n == seen => break,
                Mode::DropAnswer(n) if n == seen => {
                    muted.store(true, Ordering::SeqCst);
                    let _ = to_server.write_all(&message);
                    // Time for the server to run it.
                    std::thread::sleep(Duration::from_millis(300));
                    break;
                }
                _ => {}
            }
        }
        if to_server.write_all(&message).is_err() {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    let _ = answers.join();
}

/// A length-prefixed packet of the startup phase (length included).
fn read_untyped(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut length = [0u8; 4];
    stream.read_exact(&mut length).ok()?;
    let total = u32::from_be_bytes(length) as usize;
    if !(8..=1 << 20).contains(&total) {
        return None;
    }
    let mut packet = length.to_vec();
    packet.resize(total, 0);
    stream.read_exact(&mut packet[4..]).ok()?;
    Some(packet)
}

/// A typed message (type byte, length, body).
fn read_typed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).ok()?;
    let length = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if !(4..=1 << 30).contains(&length) {
        return None;
    }
    let mut message = head.to_vec();
    message.resize(1 + length, 0);
    stream.read_exact(&mut message[5..]).ok()?;
    Some(message)
}
