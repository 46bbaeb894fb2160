//! Hostile HTTP/1.1 answers from the upstream, each run through both of goodput's HTTP/1.1
//! clients: the relay (`upstream.http1_relay = true`) and hyper's client connection
//! (`false`), set in the config of each run rather than by `GOODPUT_TEST_UPSTREAM_CLIENT`.
//!
//! For every case the fake upstream answers the first request with the hostile script and
//! every later one correctly. Each run checks, in order:
//!
//! 1. what the client received: the status line and the body bytes, whole or cut short;
//! 2. the record: its outcome and status agree with what the client received, and so
//!    does the byte count of a forwarded body;
//! 3. that the next request to the same upstream gets its own, correct answer, on the
//!    connection the case allows (the one the hostile answer came on only if that answer
//!    left it clean), and that nothing was retried: the upstream saw exactly two requests.
//!
//! Hostile bytes go out in one write, so that the proxy reads them as they were sent and
//! each case has one outcome. Where something must happen on a connection idling in the
//! pool, the script holds ([`Step::Hold`]) until the client has its answer (the connection
//! goes back to the pool before the client's last byte leaves), and the next request is
//! sent once the fake says the script ended: on loopback, what it wrote is then in the
//! proxy's receive queue.

use std::fmt::Write as _;

use super::*;

mod framing;
mod heads;
mod interim;
mod pooled;

const ANSWERS_WAIT: Duration = Duration::from_secs(10);
const NEXT_BODY: &[u8] = br#"{"next":"answer"}"#;

/// What the client of the hostile answer must receive.
#[derive(Clone, Debug)]
enum Expect {
    /// The proxy's own 502, with this error code in its JSON body.
    BadGateway(&'static str),
    /// The upstream's status and the whole body.
    Whole(u16, &'static [u8]),
    /// The upstream's status and this much of the body, then the connection ends without
    /// the body's end.
    Cut(u16, &'static [u8]),
}

/// Which upstream connection the next request must go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// The same one: the hostile answer was well framed and left nothing behind.
    Reused,
    /// A new one: the first is unusable (closed, desynchronised or holding unread bytes).
    Fresh,
}

/// One hostile answer and what goodput must make of it.
#[derive(Clone, Debug)]
struct Case {
    script: Script,
    /// The client's request is a `HEAD` (else a `POST` with a JSON body).
    head: bool,
    expect: Expect,
    /// The record's outcome; by default the one `expect` implies.
    outcome: Option<&'static str>,
    next: Next,
    /// Header fields that must not reach the client (lowercase names).
    absent: &'static [&'static str],
    /// A header field the client must receive, value included.
    present: Option<(&'static str, &'static str)>,
}

impl Case {
    /// The upstream writes `bytes` in one write and keeps the connection open.
    fn answer(bytes: &[u8]) -> Case {
        Case::script(Script::new(vec![Step::Write(Bytes::copy_from_slice(
            bytes,
        ))]))
    }

    /// The upstream writes `bytes` in one write, then closes (FIN).
    fn answer_then_close(bytes: &[u8]) -> Case {
        Case::script(Script::new(vec![
            Step::Write(Bytes::copy_from_slice(bytes)),
            Step::Close,
        ]))
    }

    fn script(script: Script) -> Case {
        Case {
            script,
            head: false,
            expect: Expect::BadGateway(""),
            outcome: None,
            next: Next::Fresh,
            absent: &[],
            present: None,
        }
    }

    /// The proxy answers 502 with `code`; the connection is not used again.
    fn bad_gateway(mut self, code: &'static str) -> Case {
        self.expect = Expect::BadGateway(code);
        self.next = Next::Fresh;
        self
    }

    /// The client gets `status` and the whole `body`.
    fn whole(mut self, status: u16, body: &'static [u8]) -> Case {
        self.expect = Expect::Whole(status, body);
        self
    }

    /// The client gets `status` and `body`, then the connection ends short of the body's end.
    fn cut(mut self, status: u16, body: &'static [u8]) -> Case {
        self.expect = Expect::Cut(status, body);
        self.next = Next::Fresh;
        self
    }

    /// The connection carries the next request.
    fn reused(mut self) -> Case {
        self.next = Next::Reused;
        self
    }

    /// The client's request is a `HEAD`.
    fn for_head(mut self) -> Case {
        self.head = true;
        self
    }

    fn outcome(mut self, outcome: &'static str) -> Case {
        self.outcome = Some(outcome);
        self
    }

    fn without(mut self, names: &'static [&'static str]) -> Case {
        self.absent = names;
        self
    }

    fn with_field(mut self, name: &'static str, value: &'static str) -> Case {
        self.present = Some((name, value));
        self
    }

    fn record_outcome(&self) -> &'static str {
        if let Some(outcome) = self.outcome {
            return outcome;
        }
        match self.expect {
            Expect::BadGateway(_) => "upstream_error",
            Expect::Cut(..) => "upstream_reset",
            Expect::Whole(status, _) if status < 400 => "ok",
            Expect::Whole(..) => "upstream_error",
        }
    }

    fn holds(&self) -> bool {
        self.script.steps.contains(&Step::Hold)
    }

    fn early(&self) -> bool {
        self.script.steps.first() == Some(&Step::Early)
    }
}

/// `cases! { name => case, ... }`: a test per case, each run on both paths.
macro_rules! cases {
    ($($(#[doc = $doc:expr])* $name:ident => $case:expr,)*) => {
        $(
            $(#[doc = $doc])*
            #[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                super::on_both_paths($case).await;
            }
        )*
    };
}
use cases;

/// Runs `case` with the relay, then with hyper's client, and fails with what went wrong
/// on either.
async fn on_both_paths(case: Case) {
    let mut failures = String::new();
    for relay in [true, false] {
        if let Err(e) = run(&case, relay).await {
            let path = if relay { "relay" } else { "hyper's client" };
            let _ = writeln!(failures, "{path}: {e}");
        }
    }
    assert!(failures.is_empty(), "{case:?}\n{failures}");
}

/// `ensure!(condition, format...)`: fails the run with the message unless `condition`.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

async fn run(case: &Case, relay: bool) -> Result<(), String> {
    let good = Script::response(200, &[("content-type", "application/json")], NEXT_BODY);
    let up = FakeUpstream::start_sequence(vec![case.script.clone(), good]).await;
    let mut cfg = test_config(&up.url());
    cfg.upstream.http1_relay = relay;
    // Started directly: the harness would choose the path by the environment.
    let proxy = goodput::run::start(cfg).await.map_err(|e| e.to_string())?;
    let result = exchanges(case, &up, &proxy).await;
    // Not waited for: the records are read, and a drain would only add its flush deadline.
    proxy.begin_shutdown();
    result
}

async fn exchanges(
    case: &Case,
    up: &FakeUpstream,
    proxy: &goodput::run::Running,
) -> Result<(), String> {
    // 1. What the client received.
    let raw = if case.early() {
        early_exchange(proxy.proxy_addr).await
    } else {
        let (raw, _) = raw_exchange(
            proxy.proxy_addr,
            &request(case.head, "hostile"),
            ANSWERS_WAIT,
        )
        .await;
        raw
    };
    let got = Answer::parse(&raw, case.head)?;
    check_answer(case, &got)?;

    // 2. The record agrees.
    let r = record(proxy.admin_addr, "hostile").await?;
    ensure!(r["outcome"] == case.record_outcome(), "record outcome: {r}");
    ensure!(
        r["status"] == u64::from(got.status),
        "record status, client got {}: {r}",
        got.status
    );
    if !matches!(case.expect, Expect::BadGateway(_)) {
        ensure!(
            r["bytes_out"] == got.body.len(),
            "record bytes_out, client got {}: {r}",
            got.body.len()
        );
    }

    // 3. The next request gets its own answer.
    if case.holds() {
        up.release();
    }
    let ended = up.wait_scripts_ended(1, ANSWERS_WAIT).await;
    ensure!(ended >= 1, "the hostile script never ended");
    let (raw, _) = raw_exchange(proxy.proxy_addr, &request(false, "next"), ANSWERS_WAIT).await;
    let next = Answer::parse(&raw, false)?;
    ensure!(
        next.status == 200 && next.complete && next.body == NEXT_BODY,
        "the next request got {} {:?} (complete: {})",
        next.status,
        String::from_utf8_lossy(&next.body),
        next.complete
    );
    let r = record(proxy.admin_addr, "next").await?;
    ensure!(
        r["outcome"] == "ok" && r["status"] == 200,
        "next record: {r}"
    );
    let requests = up.requests().await;
    ensure!(
        requests.len() == 2,
        "the upstream saw {} requests, not 2 (a retry?)",
        requests.len()
    );
    let (want_conn, want_conns) = match case.next {
        Next::Reused => (0, 1),
        Next::Fresh => (1, 2),
    };
    ensure!(
        requests[1].connection == want_conn && up.connections() == want_conns,
        "the next request went on connection {} of {} ({:?} expected)",
        requests[1].connection,
        up.connections(),
        case.next
    );
    Ok(())
}

/// What the client received, against what the case expects.
fn check_answer(case: &Case, got: &Answer) -> Result<(), String> {
    let shown = || {
        format!(
            "{} {:?} (complete: {})",
            got.status,
            String::from_utf8_lossy(&got.body),
            got.complete
        )
    };
    match case.expect {
        Expect::BadGateway(code) => {
            ensure!(
                got.status == 502 && got.complete,
                "wanted a 502, got {}",
                shown()
            );
            ensure!(
                error_code(&got.body) == code,
                "wanted code {code}, got {}",
                shown()
            );
        }
        Expect::Whole(status, body) => {
            ensure!(
                got.status == status && got.complete && got.body == body,
                "wanted {status} {:?} whole, got {}",
                String::from_utf8_lossy(body),
                shown()
            );
        }
        Expect::Cut(status, body) => {
            ensure!(
                got.status == status && !got.complete && got.body == body,
                "wanted {status} {:?} cut, got {}",
                String::from_utf8_lossy(body),
                shown()
            );
        }
    }
    for name in case.absent {
        ensure!(
            got.field(name).is_none(),
            "{name} reached the client:\n{}",
            got.head
        );
    }
    if let Some((name, value)) = case.present {
        ensure!(
            got.field(name).as_deref() == Some(value),
            "wanted {name}: {value}:\n{}",
            got.head
        );
    }
    Ok(())
}

/// A raw request with `Connection: close` and `x-request-id: id`: a `HEAD`, or a `POST`
/// of a chat completion.
fn request(head: bool, id: &str) -> Vec<u8> {
    if head {
        return format!("HEAD /v1/models HTTP/1.1\r\nhost: test\r\nx-request-id: {id}\r\nconnection: close\r\n\r\n").into_bytes();
    }
    let body = chat_body(false, 5, false);
    format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-request-id: {id}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends a request head announcing a body and none of the body, then reads until a
/// complete response is in or the connection ends. None of the body is on its way when
/// the upstream answers and closes, so its close is a FIN, never a reset that could
/// overtake the answer.
async fn early_exchange(addr: SocketAddr) -> Vec<u8> {
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: 65536\r\nx-request-id: hostile\r\nconnection: close\r\n\r\n"
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            if Answer::parse(&raw, false).is_ok_and(|a| a.complete) {
                return;
            }
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(ANSWERS_WAIT, read).await;
    raw
}

/// The record of request `id`, once it is there.
async fn record(admin: SocketAddr, id: &str) -> Result<Value, String> {
    poll_loop!(deadline = tokio::time::Instant::now() + ANSWERS_WAIT, {
        if let Some(r) = records(admin).await.into_iter().find(|r| r["id"] == id) {
            return Ok(r);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("no record of {id}"));
        }
    });
}

/// A response as the client read it.
#[derive(Debug)]
struct Answer {
    head: String,
    status: u16,
    /// The body's payload (chunked coding taken off).
    body: Vec<u8>,
    /// The body reached its end as its framing says.
    complete: bool,
}

impl Answer {
    /// Parses what a client read. A body of a response that has none (to a `HEAD`, a 204
    /// or a 304) must be empty; bytes after a body's end are an error.
    fn parse(raw: &[u8], head_request: bool) -> Result<Answer, String> {
        let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Err(format!(
                "no response head: {:?}",
                String::from_utf8_lossy(raw)
            ));
        };
        let head = String::from_utf8_lossy(&raw[..end + 4]).into_owned();
        let rest = &raw[end + 4..];
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status: {head}"))?;
        let mut answer = Answer {
            head,
            status,
            body: Vec::new(),
            complete: true,
        };
        let chunked = answer
            .field("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let length = answer
            .field("content-length")
            .and_then(|v| v.parse::<usize>().ok());
        if head_request || status == 204 || status == 304 {
            answer.body = rest.to_vec();
        } else if chunked {
            match decode_chunked(rest) {
                Some((data, used)) => {
                    ensure!(
                        used == rest.len(),
                        "bytes after the chunked body: {:?}",
                        String::from_utf8_lossy(&rest[used..])
                    );
                    answer.body = data;
                }
                None => {
                    answer.body = whole_chunks(rest);
                    answer.complete = false;
                }
            }
        } else if let Some(length) = length {
            ensure!(
                rest.len() <= length,
                "bytes after the body: {:?}",
                String::from_utf8_lossy(rest)
            );
            answer.body = rest.to_vec();
            answer.complete = rest.len() == length;
        } else {
            answer.body = rest.to_vec();
        }
        Ok(answer)
    }

    /// The value of the first header field `name` (any case).
    fn field(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

/// The payload of the whole chunks at the start of a chunked body that was cut.
pub(super) fn whole_chunks(mut input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = input.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&input[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let Some(size) = size.filter(|&n| n > 0) else {
            return out;
        };
        let start = eol + 2;
        if input.len() < start + size + 2 {
            return out;
        }
        out.extend_from_slice(&input[start..start + size]);
        input = &input[start + size + 2..];
    }
}
