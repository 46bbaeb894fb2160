//! The upstream connection pool's invariant, as a property over generated plans, on both
//! of goodput's HTTP/1.1 clients (the relay and hyper's client connection):
//!
//! - every client receives exactly the answer the upstream wrote for its own request, on
//!   the connection that request arrived on, or an error (the proxy's 502, 503 or 504, or
//!   a cut whose bytes are a prefix of its own answer); never another request's bytes,
//!   and never bytes the upstream wrote before the request came;
//! - a connection on which the upstream wrote bytes nobody asked for, or sent its FIN, is
//!   never given another request ([`upstream`] reports any request that arrives on one);
//! - no request reaches the upstream twice.
//!
//! A plan is a list of events: a batch of one to three requests at once, each telling the
//! upstream what to do with it (a complete answer, alone or with bytes after it, or
//! followed by FIN or RST; FIN or RST instead of an answer; half an answer, then FIN or
//! RST), or a poke at a connection idling in the pool (bytes nobody asked for, FIN, RST).
//! So the upstream's misbehaviour falls before a connection idles (with or right after
//! the answer), while it idles (pokes), and after it leaves the pool (instead of the next
//! answer). Events run one after the other: a batch ends when every client has its answer
//! and the upstream has carried out every action to its last write; a poke ends when the
//! upstream has written, shut down or reset. On loopback, what the upstream wrote is then
//! in the proxy's receive queue, so whether a pooled connection was spoiled when the next
//! request comes is decided, not raced.

use std::{net::SocketAddr, time::Duration};

use proptest::{collection::vec, prelude::*, test_runner::FileFailurePersistence};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinSet,
};

use crate::common::{fake::decode_chunked, harness::test_config};

use super::upstream_answers::whole_chunks;

mod upstream;

use upstream::{Action, Poke, Upstream, answer_body};

/// An upper bound for anything that takes milliseconds on loopback.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
enum Event {
    /// Requests sent at once, each answered (once all have arrived) as its action says.
    Requests(Vec<Action>),
    /// The upstream does this on the k-th (modulo) connection idling between requests.
    Poke(usize, Poke),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => Just(Action::Answer),
        1 => Just(Action::AnswerThenExtra),
        1 => Just(Action::AnswerThenFin),
        1 => Just(Action::AnswerThenRst),
        1 => Just(Action::Fin),
        1 => Just(Action::Rst),
        1 => Just(Action::HalfThenFin),
        1 => Just(Action::HalfThenRst),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    let poke = prop_oneof![Just(Poke::Unsolicited), Just(Poke::Fin), Just(Poke::Rst)];
    prop_oneof![
        3 => vec(action(), 1..=3).prop_map(Event::Requests),
        2 => (0usize..4, poke).prop_map(|(k, poke)| Event::Poke(k, poke)),
    ]
}

/// What a client read.
#[derive(Debug)]
enum Got {
    /// A complete response: its status and body.
    Whole(u16, Vec<u8>),
    /// A response cut short: its status (if its head came) and what came of its body.
    Cut(Option<u16>, Vec<u8>),
    /// A complete response with more bytes after it.
    Trailing(Vec<u8>),
}

/// Runs `plan` through a proxy in front of a fresh upstream, and says what broke the
/// invariant, if anything did.
async fn run(plan: &[Event], relay: bool) -> Result<(), String> {
    let up = Upstream::start().await.map_err(|e| e.to_string())?;
    let mut cfg = test_config(&format!("http://{}", up.addr));
    cfg.upstream.http1_relay = relay;
    // Room for every request of a batch, so that none waits for a connection.
    cfg.upstream.max_connections = 4;
    let proxy = goodput::run::start(cfg).await.map_err(|e| e.to_string())?;
    let result = run_on(plan, &up, proxy.proxy_addr).await;
    proxy.begin_shutdown();
    result
}

async fn run_on(plan: &[Event], up: &Upstream, proxy: SocketAddr) -> Result<(), String> {
    let mut sent: Vec<(u32, Action, Got)> = Vec::new();
    for event in plan {
        match event {
            Event::Requests(actions) => {
                up.batch(actions.len());
                let mut clients = JoinSet::new();
                for &action in actions {
                    let id = u32::try_from(sent.len() + clients.len()).unwrap_or(u32::MAX);
                    clients.spawn(async move { (id, action, exchange(proxy, id, action).await) });
                }
                while let Some(done) = clients.join_next().await {
                    let (id, action, got) = done.map_err(|e| e.to_string())?;
                    sent.push((id, action, got?));
                }
                if !up.wait_handled(sent.len(), WAIT).await {
                    let (arrivals, _) = up.seen();
                    return Err(format!(
                        "requests not all dealt with; arrivals {arrivals:?}"
                    ));
                }
            }
            Event::Poke(k, poke) => up.poke(*k, *poke).await,
        }
    }
    check(&sent, up)
}

/// The invariant, over what every client read and what the upstream saw.
fn check(sent: &[(u32, Action, Got)], up: &Upstream) -> Result<(), String> {
    let (arrivals, violations) = up.seen();
    if !violations.is_empty() {
        return Err(format!("{violations:?}"));
    }
    for (id, action, got) in sent {
        let on: Vec<usize> = arrivals
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, conn)| *conn)
            .collect();
        let [conn] = on[..] else {
            return Err(format!("request {id} arrived on connections {on:?}"));
        };
        let own = answer_body(*id, conn).into_bytes();
        let fine = match got {
            Got::Whole(200, body) => *body == own,
            // The proxy's own answers when the upstream failed.
            Got::Whole(502..=504, _) => !must_arrive_whole(*action),
            Got::Whole(..) => false,
            Got::Cut(_, partial) => !must_arrive_whole(*action) && own.starts_with(partial),
            Got::Trailing(_) => false,
        };
        if !fine {
            return Err(format!(
                "request {id} ({action:?}, on connection {conn}) got {}",
                shown(got)
            ));
        }
    }
    Ok(())
}

/// An answer written whole, nothing but a FIN or bytes after it, reaches its client whole.
/// (After an RST the proxy may lose what it had not read yet.)
fn must_arrive_whole(action: Action) -> bool {
    matches!(
        action,
        Action::Answer | Action::AnswerThenExtra | Action::AnswerThenFin
    )
}

fn shown(got: &Got) -> String {
    match got {
        Got::Whole(status, body) => format!("{status} {:?}", String::from_utf8_lossy(body)),
        Got::Cut(status, body) => {
            format!("{status:?} {:?}, cut", String::from_utf8_lossy(body))
        }
        Got::Trailing(raw) => format!("{:?}, bytes after its end", String::from_utf8_lossy(raw)),
    }
}

/// Sends request `id` on a connection of its own and reads until the proxy closes it.
async fn exchange(proxy: SocketAddr, id: u32, action: Action) -> Result<Got, String> {
    let body = r#"{"model":"m","messages":[]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-request-id: r{id}\r\nx-plan: {}\r\nconnection: close\r\n\r\n{body}",
        body.len(),
        action.name(),
    );
    let mut s = TcpStream::connect(proxy).await.map_err(|e| e.to_string())?;
    s.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(WAIT, read)
        .await
        .map_err(|_| format!("request {id}: the proxy never ended the exchange"))?;
    Ok(parse(&raw))
}

/// What a client read, as a response whole or cut.
fn parse(raw: &[u8]) -> Got {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Got::Cut(None, Vec::new());
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let rest = &raw[end + 4..];
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
    let Some(status) = status else {
        return Got::Cut(None, Vec::new());
    };
    let field = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n.trim() == name).then(|| v.trim().to_owned())
        })
    };
    if field("transfer-encoding").as_deref() == Some("chunked") {
        return match decode_chunked(rest) {
            Some((data, used)) if used == rest.len() => Got::Whole(status, data),
            Some(_) => Got::Trailing(raw.to_vec()),
            None => Got::Cut(Some(status), whole_chunks(rest)),
        };
    }
    match field("content-length").and_then(|v| v.parse::<usize>().ok()) {
        Some(length) if rest.len() == length => Got::Whole(status, rest.to_vec()),
        Some(length) if rest.len() > length => Got::Trailing(raw.to_vec()),
        _ => Got::Cut(Some(status), rest.to_vec()),
    }
}

/// Runs `plan` on both paths in a runtime of its own.
fn on_both_paths(plan: &[Event]) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        for relay in [true, false] {
            let path = if relay { "relay" } else { "hyper's client" };
            run(plan, relay).await.map_err(|e| format!("{path}: {e}"))?;
        }
        Ok(())
    })
}

proptest! {
    // Each case starts two proxies and makes a few dozen loopback exchanges: well under
    // a second in all on two cores. Failures are kept beside the other properties'.
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/hostile/pool_invariant.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_pooled_connection_never_gives_a_client_another_requests_bytes(
        plan in vec(event(), 1..=8)
    ) {
        let checked = on_both_paths(&plan);
        prop_assert!(checked.is_ok(), "{}", checked.err().unwrap_or_default());
    }
}

/// The property is not vacuous: a connection nothing happened to is reused, and the
/// upstream's bytes on an idle one are noticed.
#[test]
fn connections_are_reused_until_the_upstream_spoils_them() {
    let plan = [
        Event::Requests(vec![Action::Answer]),
        Event::Requests(vec![Action::Answer]),
        Event::Poke(0, Poke::Unsolicited),
        Event::Requests(vec![Action::Answer]),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for relay in [true, false] {
            let up = Upstream::start().await.unwrap();
            let mut cfg = test_config(&format!("http://{}", up.addr));
            cfg.upstream.http1_relay = relay;
            let proxy = goodput::run::start(cfg).await.unwrap();
            run_on(&plan, &up, proxy.proxy_addr).await.unwrap();
            let (arrivals, _) = up.seen();
            assert_eq!(arrivals, [(0, 0), (1, 0), (2, 1)], "relay: {relay}");
            proxy.begin_shutdown();
        }
    });
}
