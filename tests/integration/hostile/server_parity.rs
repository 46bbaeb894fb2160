//! goodput's own HTTP/1.1 server connection (`server.http1_own`) against hyper's, on the
//! same raw client bytes: a committed set of seeds (the smuggling cases, framing edge
//! cases, pipelines) and deterministic variations of them. Both proxies stand in front of
//! fake upstreams answering alike, and for every input:
//!
//! - the client receives the same bytes from both (the `date` values aside): the same
//!   statuses for what either refuses, the same heads and bodies for what they forward;
//! - the upstream receives the same requests: head byte for byte, and the same body
//!   (decoded; its framing is the upstream client's, the same for both).
//!
//! `GOODPUT_PARITY_CORPUS=fuzz/corpus/http_exchange` adds the client's part of every
//! exchange in that fuzz corpus to the inputs (those opening with the HTTP/2 preface,
//! hyper's on both, aside).
//!
//! The client half-closes after its bytes (`server.http1_half_close` on for both), so every
//! exchange ends when the proxy has answered what it will, without a timer deciding.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::*;

/// What the fake upstreams answer every request with.
fn answer() -> Script {
    Script::response(200, &[("content-type", "text/plain")], b"upstream says hi")
}

const SEEDS: &[&[u8]] = &[
    b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"GET /v1/models?x=1 HTTP/1.1\r\nHost: t\r\nX-A: 1\r\nx-a: 2\r\nAccept: */*\r\n\r\n",
    b"HEAD /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    // Smuggling: CL.TE, TE.CL, CL.CL, TE identity, TE on HTTP/1.0, signed length.
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: +5\r\n\r\nhello",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 1 2\r\n\r\nhello",
    // Chunk framing: a huge size, a bad size, a bare LF, a missing CRLF after data.
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    // Heads: obs-fold, bare LF, a space before the colon, no host, absolute form, bad
    // method and version, HTTP/1.0 keep-alive, close.
    b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n 2\r\n\r\n",
    b"GET /v1/models HTTP/1.1\nHost: t\n\n",
    b"GET /v1/models HTTP/1.1\r\nHost : t\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\n\r\n",
    b"GET http://t/v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"G@T /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"GET /v1/models HTTP/1.2\r\nHost: t\r\n\r\n",
    b"GET /v1/models HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n\r\nGET /v1/models HTTP/1.0\r\nHost: t\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello",
    // A pipeline: three requests, the last malformed.
    b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nPOST /b HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nokGET /c HTTR/1.1\r\nHost: t\r\n\r\n",
];

/// Variations of each seed.
const VARIATIONS: usize = 10;

/// Bytes a variation inserts: the ones framing and heads turn on.
const INSERTS: &[&[u8]] = &[
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"\t",
    b":",
    b"0",
    b"9",
    b"f",
    b";",
    b",",
    b"\x00",
    b"\x7f",
    b"\xff",
    b"chunked",
    b"Content-Length: 3\r\n",
    b"Transfer-Encoding: chunked\r\n",
];

/// A deterministic variation of `seed`: a few insertions, deletions and case flips.
fn vary(seed: &[u8], rng: &mut SmallRng) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..rng.random_range(1..=3) {
        if out.is_empty() {
            break;
        }
        let at = rng.random_range(0..out.len());
        match rng.random_range(0..4) {
            0 => {
                let insert = INSERTS[rng.random_range(0..INSERTS.len())];
                out.splice(at..at, insert.iter().copied());
            }
            1 => {
                out.remove(at);
            }
            2 => out[at] = out[at].to_ascii_uppercase(),
            _ => out[at] ^= 0x20,
        }
    }
    out
}

/// Sends `input`, half-closes, and reads until the proxy closes.
async fn exchange(addr: SocketAddr, input: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(input).await.unwrap();
    s.shutdown().await.unwrap();
    let mut out = Vec::new();
    // Bounded only against a hang (a failure either way): the proxy closes by itself.
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "no end to the exchange of {:?}",
        String::from_utf8_lossy(input)
    );
    out
}

/// What differs between the two runs whatever the server: `date`, the request ids
/// goodput generates, the fake upstream's port. Masked.
fn masked(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match ["date: ", "x-request-id: ", "host: 127.0.0.1:"]
            .iter()
            .find(|p| line.starts_with(**p))
        {
            Some(prefix) => {
                out.push_str(prefix);
                out.push_str("*\r\n");
            }
            None => out.push_str(line),
        }
    }
    // The proxy's own error answers name their cause in words that are the body
    // decoder's (hyper's or the relay grammar's): their code, status and shape must agree.
    if out.contains("\"type\":\"goodput_proxy_error\"") {
        let message = regex::Regex::new(r#""message":"[^"]*""#).unwrap();
        let length = regex::Regex::new(r"content-length: \d+").unwrap();
        out = message.replace_all(&out, r#""message":"*""#).into_owned();
        out = length.replace_all(&out, "content-length: *").into_owned();
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_own_server_answers_and_forwards_as_hypers_does() {
    let mut proxies = Vec::new();
    for own in [true, false] {
        let up = FakeUpstream::start(answer()).await;
        let mut cfg = test_config(&up.url());
        cfg.server.http1_own = own;
        cfg.server.http1_half_close = true;
        cfg.server.limits.max_request_header_bytes = 8192;
        let proxy = goodput::run::start(cfg).await.unwrap();
        proxies.push((up, proxy));
    }
    let seed = std::env::var("GOODPUT_PARITY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(41);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut inputs: Vec<Vec<u8>> = SEEDS.iter().map(|s| s.to_vec()).collect();
    let mut big = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nX-Big: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 9000));
    big.extend_from_slice(b"\r\n\r\n");
    inputs.push(big);
    let many: String = (0..101).map(|i| format!("x-{i}: 1\r\n")).collect();
    inputs.push(format!("GET /v1/models HTTP/1.1\r\nHost: t\r\n{many}\r\n").into_bytes());
    for _ in 0..VARIATIONS {
        for seed in SEEDS {
            inputs.push(vary(seed, &mut rng));
        }
    }
    if let Ok(dir) = std::env::var("GOODPUT_PARITY_CORPUS") {
        // A fuzz corpus of exchanges (fuzz/corpus/http_exchange): the client's part of each.
        let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        files.sort_by_key(std::fs::DirEntry::path);
        for file in files {
            let data = std::fs::read(file.path()).unwrap();
            let client = match data.windows(14).position(|w| w == b"\n--upstream--\n") {
                Some(at) => data[..at].to_vec(),
                None => data,
            };
            // HTTP/2 with prior knowledge is hyper's on both, its frames timed its own way.
            if !client.starts_with(b"PRI * HTTP/2.0") {
                inputs.push(client);
            }
        }
    }
    let (mut refused, mut forwarded) = (0, 0);
    for input in &inputs {
        let mut seen = Vec::new();
        for (up, proxy) in &proxies {
            let before = up.requests().await.len();
            let answer = exchange(proxy.proxy_addr, input).await;
            let received: Vec<_> = up.requests().await.split_off(before);
            seen.push((masked(&answer), received));
        }
        let (own, hyper) = (&seen[0], &seen[1]);
        let shown = String::from_utf8_lossy(input);
        assert_eq!(own.0, hyper.0, "the client's answers differ for {shown:?}");
        let heads = |r: &[crate::common::fake::Received]| -> Vec<(String, Vec<u8>)> {
            r.iter()
                .map(|r| (masked(&r.raw_head), r.body.clone()))
                .collect()
        };
        assert_eq!(
            heads(&own.1),
            heads(&hyper.1),
            "the upstream's requests differ for {shown:?}"
        );
        if own.1.is_empty() {
            refused += 1;
        } else {
            forwarded += 1;
        }
    }
    eprintln!(
        "{} inputs: {refused} refused, {forwarded} forwarded",
        inputs.len()
    );
    // Both kinds were exercised.
    assert!(
        refused > 10 && forwarded > 10,
        "{refused} refused, {forwarded} forwarded"
    );
    for (_, proxy) in proxies {
        proxy.shutdown().await;
    }
}
