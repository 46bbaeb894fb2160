//! The property test's upstream: HTTP/1.1 over raw tokio TCP, doing with each request what
//! the request's `x-plan` header says ([`Action`]), and with an idle connection what the
//! test asks ([`Poke`]). It keeps what the property needs: where each request arrived, and
//! any request that arrived on a connection that could not carry it any more (after
//! bytes nobody asked for, or after the upstream's FIN).
//!
//! Everything the test waits for is signalled through one `watch` of [`State`]: requests
//! arriving, actions carried out to their last write, connections idling.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use bytes::{Buf, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot, watch},
    task::{JoinHandle, JoinSet},
};

/// What the upstream does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A complete answer; the connection stays open.
    Answer,
    /// A complete answer and, in the same write, bytes nobody asked for.
    AnswerThenExtra,
    /// A complete answer, then FIN.
    AnswerThenFin,
    /// A complete answer, then RST.
    AnswerThenRst,
    /// FIN instead of an answer.
    Fin,
    /// RST instead of an answer.
    Rst,
    /// The head and half the body, then FIN.
    HalfThenFin,
    /// The head and half the body, then RST.
    HalfThenRst,
}

impl Action {
    const ALL: [Action; 8] = [
        Action::Answer,
        Action::AnswerThenExtra,
        Action::AnswerThenFin,
        Action::AnswerThenRst,
        Action::Fin,
        Action::Rst,
        Action::HalfThenFin,
        Action::HalfThenRst,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Action::Answer => "answer",
            Action::AnswerThenExtra => "answer-then-extra",
            Action::AnswerThenFin => "answer-then-fin",
            Action::AnswerThenRst => "answer-then-rst",
            Action::Fin => "fin",
            Action::Rst => "rst",
            Action::HalfThenFin => "half-then-fin",
            Action::HalfThenRst => "half-then-rst",
        }
    }

    fn named(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// What the upstream does on a connection idling in the proxy's pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poke {
    /// Writes bytes nobody asked for.
    Unsolicited,
    Fin,
    Rst,
}

/// Bytes nobody asked for: an answer of its own, so that a proxy that took them for the
/// next request's would forward them.
pub const UNSOLICITED: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nforeign";

/// The body of the answer to request `id` on connection `conn`.
pub fn answer_body(id: u32, conn: usize) -> String {
    format!("request {id} on connection {conn}")
}

type Poker = mpsc::UnboundedSender<(Poke, oneshot::Sender<()>)>;

/// What the test reads of the upstream.
#[derive(Default)]
pub struct State {
    /// Each request's id and the connection (in accept order) it arrived on, in order.
    pub arrivals: Vec<(u32, usize)>,
    /// Requests dealt with: their action carried out to its last write, or refused.
    pub handled: usize,
    /// Requests on connections that could not carry them.
    pub violations: Vec<String>,
    /// Open connections between requests that a poke may reach, oldest first.
    idle: Vec<(usize, Poker)>,
    /// How many requests must have arrived before any is answered.
    hold_until: usize,
}

pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<watch::Sender<State>>,
    accept: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // The accept task owns every connection task.
        self.accept.abort();
    }
}

impl Upstream {
    pub async fn start() -> std::io::Result<Upstream> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(watch::Sender::new(State::default()));
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(Upstream {
            addr,
            state,
            accept,
        })
    }

    /// The next `n` requests are answered only once all of them have arrived, so that
    /// each holds a connection of its own meanwhile.
    pub fn batch(&self, n: usize) {
        self.state
            .send_modify(|s| s.hold_until = s.arrivals.len() + n);
    }

    /// Waits until `n` requests have been dealt with; false after `within`.
    pub async fn wait_handled(&self, n: usize, within: Duration) -> bool {
        let mut rx = self.state.subscribe();
        tokio::time::timeout(within, rx.wait_for(|s| s.handled >= n))
            .await
            .is_ok()
    }

    /// Pokes the `k`-th (modulo) of the connections idling between requests, and returns
    /// once it is done (written, shut down or reset); nothing when none idles.
    pub async fn poke(&self, k: usize, poke: Poke) {
        let mut target = None;
        self.state.send_modify(|s| {
            if !s.idle.is_empty() {
                target = Some(s.idle.remove(k % s.idle.len()).1);
            }
        });
        let Some(poker) = target else {
            return;
        };
        let (done, acked) = oneshot::channel();
        if poker.send((poke, done)).is_ok() {
            // A connection the proxy closed meanwhile ends without answering.
            let _ = acked.await;
        }
    }

    /// Where each request arrived, and the violations seen.
    pub fn seen(&self) -> (Vec<(u32, usize)>, Vec<String>) {
        let s = self.state.borrow();
        (s.arrivals.clone(), s.violations.clone())
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<watch::Sender<State>>) {
    let mut conns = JoinSet::new();
    let mut index = 0;
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        conns.spawn(
            Conn {
                stream,
                index,
                state: Arc::clone(&state),
                buf: BytesMut::new(),
                spoiled: None,
            }
            .serve(),
        );
        index += 1;
    }
}

struct Conn {
    stream: TcpStream,
    index: usize,
    state: Arc<watch::Sender<State>>,
    buf: BytesMut,
    /// Why this connection can no longer carry a request, once it cannot.
    spoiled: Option<&'static str>,
}

/// What woke a connection waiting for a request.
enum Woke {
    Read(std::io::Result<usize>),
    Poke(Poke, oneshot::Sender<()>),
}

/// How a connection goes on after a request or a poke.
enum Then {
    /// Open, between requests: pokes may reach it.
    Idle,
    /// Open for reading only (after its FIN), or spoiled: watched for requests, not poked.
    Watched,
    Gone,
}

impl Conn {
    async fn serve(mut self) {
        let (poker, mut pokes) = mpsc::unbounded_channel();
        let index = self.index;
        loop {
            // A request, or pokes while waiting for one.
            let request = loop {
                if let Some(request) = self.take_request() {
                    break Some(request);
                }
                let woke = tokio::select! {
                    read = self.stream.read_buf(&mut self.buf) => Woke::Read(read),
                    Some((poke, done)) = pokes.recv() => Woke::Poke(poke, done),
                };
                match woke {
                    Woke::Read(Ok(0) | Err(_)) => break None,
                    Woke::Read(Ok(_)) => {}
                    Woke::Poke(poke, done) => {
                        let next = self.poked(poke).await;
                        if let Then::Gone = next {
                            // The RST leaves with the socket, before the poke is done.
                            drop(self.stream);
                            let _ = done.send(());
                            return;
                        }
                        if let Then::Idle = next {
                            self.state
                                .send_modify(|s| s.idle.push((index, poker.clone())));
                        }
                        let _ = done.send(());
                    }
                }
            };
            self.state
                .send_modify(|s| s.idle.retain(|(i, _)| *i != index));
            let Some((id, action)) = request else {
                return;
            };
            if let Some(why) = self.spoiled {
                self.state.send_modify(|s| {
                    s.violations
                        .push(format!("request {id} on connection {index} after {why}"));
                    s.handled += 1;
                });
                return;
            }
            let mut rx = self.state.subscribe();
            self.state.send_modify(|s| s.arrivals.push((id, index)));
            if rx
                .wait_for(|s| s.arrivals.len() >= s.hold_until)
                .await
                .is_err()
            {
                return;
            }
            let then = self.act(id, action).await;
            if let Then::Gone = then {
                // The RST leaves with the socket, before the request counts as dealt with.
                drop(self.stream);
                self.state.send_modify(|s| s.handled += 1);
                return;
            }
            // One change, so that a test that sees the request dealt with sees its
            // connection idling too.
            self.state.send_modify(|s| {
                s.handled += 1;
                if let Then::Idle = then {
                    s.idle.push((index, poker.clone()));
                }
            });
        }
    }

    /// Carries out `action` for request `id`.
    async fn act(&mut self, id: u32, action: Action) -> Then {
        let body = answer_body(id, self.index);
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
        let answer = format!("{head}{body}").into_bytes();
        let half = format!("{head}{}", &body[..body.len() / 2]).into_bytes();
        match action {
            Action::Answer => {
                self.write(&answer).await;
                Then::Idle
            }
            Action::AnswerThenExtra => {
                self.write(&[&answer[..], UNSOLICITED].concat()).await;
                self.spoiled = Some("unsolicited bytes");
                Then::Watched
            }
            Action::AnswerThenFin => {
                self.write(&answer).await;
                self.fin().await
            }
            Action::AnswerThenRst => {
                self.write(&answer).await;
                self.rst()
            }
            Action::Fin => self.fin().await,
            Action::Rst => self.rst(),
            Action::HalfThenFin => {
                self.write(&half).await;
                self.fin().await
            }
            Action::HalfThenRst => {
                self.write(&half).await;
                self.rst()
            }
        }
    }

    async fn poked(&mut self, poke: Poke) -> Then {
        match poke {
            Poke::Unsolicited => {
                self.write(UNSOLICITED).await;
                self.spoiled = Some("unsolicited bytes");
                // Still open: a second poke may close or reset it.
                Then::Idle
            }
            Poke::Fin => self.fin().await,
            Poke::Rst => self.rst(),
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        // A peer that left is the proxy's business: what it does next is checked.
        let _ = self.stream.write_all(bytes).await;
    }

    async fn fin(&mut self) -> Then {
        let _ = self.stream.shutdown().await;
        self.spoiled = Some("its FIN");
        Then::Watched
    }

    /// Sets the socket to send an RST when the caller drops it.
    fn rst(&mut self) -> Then {
        let _ = self.stream.set_zero_linger();
        Then::Gone
    }

    /// Takes one complete request (`Content-Length` body) off the buffer: its
    /// `x-request-id` (`r<n>`) and `x-plan`. A request without them is an answerless
    /// failure of the test itself, seen as a missing arrival.
    fn take_request(&mut self) -> Option<(u32, Action)> {
        let end = self.buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        let field = |name: &str| {
            head.lines().skip(1).find_map(|line| {
                let (n, v) = line.split_once(':')?;
                n.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
        };
        let length: usize = field("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if self.buf.len() < end + length {
            return None;
        }
        self.buf.advance(end + length);
        let id = field("x-request-id")?.strip_prefix('r')?.parse().ok()?;
        let action = Action::named(&field("x-plan")?)?;
        Some((id, action))
    }
}
