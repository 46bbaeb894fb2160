use std::ops::Range;

use proptest::prelude::*;

use super::*;

/// What the observer made of `pieces`, read in turn, then the upstream's close: the
/// payload, the bytes used, and the violation if there was one.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    payload: Vec<u8>,
    used: usize,
    broken: Option<Violation>,
}

fn observe(delimiter: Delimiter, pieces: &[&[u8]]) -> Observed {
    let mut framing = Framing::new(delimiter);
    let mut payload = Vec::new();
    let mut used = 0;
    for piece in pieces {
        let mut ranges: Vec<Range<usize>> = Vec::new();
        let fed = framing.feed(piece, |r| ranges.push(r));
        for r in ranges {
            payload.extend_from_slice(&piece[r]);
        }
        match fed {
            Ok(fed) => {
                used += fed.used;
                if fed.done {
                    assert!(fed.used <= piece.len());
                    return Observed {
                        payload,
                        used,
                        broken: None,
                    };
                }
                assert_eq!(fed.used, piece.len(), "a body not done uses its whole read");
            }
            Err(broken) => {
                return Observed {
                    payload,
                    used: used + broken.at,
                    broken: Some(broken.violation),
                };
            }
        }
    }
    let broken = framing.eof().err();
    Observed {
        payload,
        used,
        broken,
    }
}

fn whole(delimiter: Delimiter, bytes: &[u8]) -> Observed {
    observe(delimiter, &[bytes])
}

/// `bytes` cut into pieces of `size`.
fn cut(bytes: &[u8], size: usize) -> Vec<&[u8]> {
    bytes.chunks(size.max(1)).collect()
}

const SSE: &[u8] = b"16\r\ndata: {\"choices\":[]}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";

#[test]
fn a_chunked_stream_gives_its_payload_whatever_the_reads() {
    let want = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n".to_vec();
    for size in 1..=SSE.len() {
        let got = observe(Delimiter::Chunked, &cut(SSE, size));
        assert_eq!(
            got,
            Observed {
                payload: want.clone(),
                used: SSE.len(),
                broken: None
            },
            "reads of {size}"
        );
    }
}

#[test]
fn bytes_after_the_end_are_not_the_bodys() {
    let mut bytes = SSE.to_vec();
    bytes.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    let got = whole(Delimiter::Chunked, &bytes);
    assert_eq!(got.used, SSE.len());
    assert_eq!(got.broken, None);
    let got = whole(Delimiter::Length(3), b"abcdef");
    assert_eq!((got.payload, got.used), (b"abc".to_vec(), 3));
}

#[test]
fn sizes_extensions_and_spaces_as_hyper_reads_them() {
    let got = whole(
        Delimiter::Chunked,
        b"A;name=value\r\n0123456789\r\n1 \t;x\r\nz\r\n0\r\n\r\n",
    );
    assert_eq!(got.payload, b"0123456789z");
    assert_eq!(got.broken, None);
    let got = whole(
        Delimiter::Chunked,
        b"0000000000000000000001\r\nx\r\n0\r\n\r\n",
    );
    assert_eq!(got.payload, b"x", "leading zeros are digits");
}

#[test]
fn violations_stop_at_the_first_bad_byte() {
    let cases: &[(&[u8], Violation, usize)] = &[
        (b"zz\r\n", Violation::ChunkSize, 0),
        (b" 5\r\nhello\r\n", Violation::ChunkSize, 0),
        (b"5x\r\nhello\r\n", Violation::ChunkSize, 1),
        (b"5 6\r\nhello\r\n", Violation::ChunkSize, 2),
        (b"11111111111111111\r\n", Violation::ChunkSizeOverflow, 16),
        (b"5;a\nb\r\nhello\r\n", Violation::ChunkExtension, 3),
        (b"5\rhello\r\n", Violation::ChunkLineEnd, 2),
        (b"5\r\nhelloX\r\n", Violation::ChunkDataEnd, 8),
        (b"5\r\nhello\rX", Violation::ChunkDataEnd, 9),
        (b"5\r\nhello\r\n0\r\n\rX", Violation::ChunkLineEnd, 14),
        (
            b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
            Violation::Trailers,
            27,
        ),
        (b"5\r\nhello\r\n0\r\nx: y\rz", Violation::Trailers, 18),
    ];
    for &(bytes, violation, at) in cases {
        let got = whole(Delimiter::Chunked, bytes);
        assert_eq!(
            (got.broken, got.used),
            (Some(violation), at),
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn a_broken_observer_reads_nothing_more() {
    let mut framing = Framing::new(Delimiter::Chunked);
    assert!(framing.feed(b"q", |_| {}).is_err());
    let again = framing.feed(b"5\r\nhello\r\n", |_| {
        panic!("no payload after a violation")
    });
    assert_eq!(
        again,
        Err(Broken {
            at: 0,
            violation: Violation::ChunkSize
        })
    );
    assert_eq!(framing.eof(), Err(Violation::ChunkSize));
}

#[test]
fn valid_trailers_end_the_body() {
    let bytes = b"5\r\nhello\r\n0\r\nx-usage: 3\r\nx-other: a b\r\n\r\n";
    for size in 1..=bytes.len() {
        let got = observe(Delimiter::Chunked, &cut(bytes, size));
        assert_eq!(got.broken, None, "reads of {size}");
        assert_eq!(got.payload, b"hello");
        assert_eq!(got.used, bytes.len());
    }
}

#[test]
fn trailers_and_extensions_are_bounded() {
    let mut many = b"0\r\n".to_vec();
    for i in 0..=TRAILER_FIELDS {
        many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(
        whole(Delimiter::Chunked, &many).broken,
        Some(Violation::Trailers)
    );
    let mut long = b"0\r\nx: ".to_vec();
    long.extend(std::iter::repeat_n(b'v', TRAILER_BYTES));
    assert_eq!(
        whole(Delimiter::Chunked, &long).broken,
        Some(Violation::Trailers)
    );
    let mut ext = b"1;".to_vec();
    ext.extend(std::iter::repeat_n(b'e', EXTENSIONS_LIMIT as usize));
    assert_eq!(
        whole(Delimiter::Chunked, &ext).broken,
        Some(Violation::ChunkExtensionsTooLong)
    );
}

#[test]
fn a_close_before_the_end_is_a_truncation_but_ends_a_close_delimited_body() {
    for bytes in [&b"5\r\nhel"[..], b"5\r\nhello\r\n", b"", b"0\r\n"] {
        let got = whole(Delimiter::Chunked, bytes);
        assert_eq!(got.broken, Some(Violation::Truncated), "{bytes:?}");
    }
    let got = whole(Delimiter::Length(10), b"short");
    assert_eq!(
        (got.payload.as_slice(), got.broken),
        (&b"short"[..], Some(Violation::Truncated))
    );
    let got = whole(Delimiter::Close, b"until the close");
    assert_eq!(
        (got.payload.as_slice(), got.broken),
        (&b"until the close"[..], None)
    );
    let empty = Framing::new(Delimiter::Length(0));
    assert!(empty.is_done());
}

// ---- The same byte streams through hyper's HTTP/1 client decoder. ----

/// What hyper's client made of a response with `head` and `body`, sent whole and then
/// closed: the data it yielded, and whether the body ended cleanly.
async fn hyper_reads(head: &str, body: &[u8]) -> (Vec<u8>, bool) {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (client, mut server) = tokio::io::duplex(1 << 20);
    let response = [head.as_bytes(), body].concat();
    let upstream = tokio::spawn(async move {
        // The request first, then the response: hyper refuses bytes nobody asked for.
        let mut seen = Vec::new();
        let mut buf = [0u8; 1024];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match server.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        let _ = server.write_all(&response).await;
        let _ = server.shutdown().await;
        // Keep the read side open until the client is done.
        let _ = server.read(&mut buf).await;
    });
    let Ok((mut send, conn)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(client)).await
    else {
        panic!("handshake");
    };
    let driver = tokio::spawn(conn);
    let req = http::Request::get("/")
        .header("host", "t")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let mut data = Vec::new();
    let ok = match send.send_request(req).await {
        Ok(resp) => {
            let mut body = resp.into_body();
            loop {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        if let Some(d) = frame.data_ref() {
                            data.extend_from_slice(d);
                        }
                    }
                    Some(Err(_)) => break false,
                    None => break true,
                }
            }
        }
        Err(_) => false,
    };
    driver.abort();
    upstream.abort();
    (data, ok)
}

fn head_of(delimiter: Delimiter) -> String {
    match delimiter {
        Delimiter::Chunked => "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_owned(),
        Delimiter::Length(n) => format!("HTTP/1.1 200 OK\r\ncontent-length: {n}\r\n\r\n"),
        Delimiter::Close => "HTTP/1.1 200 OK\r\n\r\n".to_owned(),
    }
}

/// A chunked body built from `(data length, extension, spaces)` per chunk and trailers.
fn chunked_body(chunks: &[(usize, bool, bool)], trailers: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &(len, ext, lws)) in chunks.iter().enumerate() {
        out.extend_from_slice(format!("{len:x}").as_bytes());
        if lws {
            out.extend_from_slice(b" \t");
        }
        if ext {
            out.extend_from_slice(b";name=\"v\"");
        }
        out.extend_from_slice(b"\r\n");
        out.extend((0..len).map(|j| b'a' + ((i + j) % 26) as u8));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    for t in trailers {
        out.extend_from_slice(t.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Bytes that often sit where framing is checked.
const NASTY: &[u8] = b"\r\n \t;0aF:zx\x00\x7f";

fn byte_stream() -> impl Strategy<Value = (Delimiter, Vec<u8>)> {
    let chunk = (0usize..40, any::<bool>(), any::<bool>());
    let trailer = prop::sample::select(vec!["x-a: 1", "x-b: two words", "bad", ": v", "x:\u{7f}"]);
    let built = (
        prop::collection::vec(chunk, 0..6),
        prop::collection::vec(trailer, 0..3),
        prop::collection::vec((any::<prop::sample::Index>(), 0..NASTY.len()), 0..3),
        prop::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(chunks, trailers, edits, cut)| {
            let mut body = chunked_body(&chunks, &trailers);
            for (at, b) in edits {
                let i = at.index(body.len());
                body[i] = NASTY[b];
            }
            if let Some(at) = cut {
                body.truncate(at.index(body.len() + 1));
            }
            (Delimiter::Chunked, body)
        });
    let raw = prop::collection::vec(prop::sample::select(NASTY.to_vec()), 0..40)
        .prop_map(|body| (Delimiter::Chunked, body));
    let length = (0u64..64, prop::collection::vec(any::<u8>(), 0..80))
        .prop_map(|(n, body)| (Delimiter::Length(n), body));
    let close = prop::collection::vec(any::<u8>(), 0..80).prop_map(|b| (Delimiter::Close, b));
    prop_oneof![4 => built, 2 => raw, 1 => length, 1 => close]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// hyper's decoder and the observer agree on every byte stream: the same payload, and
    /// a clean end for exactly the same streams; any cutting into reads gives the
    /// observer's same result.
    #[test]
    fn the_observer_agrees_with_hyper((delimiter, body) in byte_stream(), read in 1usize..17) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (data, ok) = rt.block_on(hyper_reads(&head_of(delimiter), &body));
        let seen = whole(delimiter, &body);
        prop_assert_eq!(&seen.payload, &data, "payload; hyper ok: {}, observer: {:?}", ok, seen.broken);
        prop_assert_eq!(seen.broken.is_none(), ok, "verdict: observer {:?}", seen.broken);
        prop_assert_eq!(observe(delimiter, &cut(&body, read)), seen);
    }
}
