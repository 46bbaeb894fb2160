//! Tests of the relay over loopback sockets, against a scripted upstream.

use std::{sync::Mutex, time::Duration};

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::{BodyExt, Empty, Full};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use super::*;
use crate::BoxError;

#[derive(Default)]
struct Shelf(Mutex<Vec<RawConn>>);

impl Home for Shelf {
    fn put_back(&self, conn: RawConn) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(conn);
    }
}

impl Shelf {
    fn count(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    fn take(&self) -> Option<RawConn> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
    }
}

/// A connection to a fresh listener, and the upstream's side of it.
async fn connected() -> (RawConn, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let reads = Arc::new(ReadClock::new());
    let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
    let conn = RawConn::new(WireStream::new(client, Arc::clone(&reads)), reads, slot);
    (conn, server)
}

fn post(body: &'static str) -> Outgoing {
    let body: ReqBody = Full::new(Bytes::from_static(body.as_bytes()))
        .map_err(|e| -> BoxError { match e {} })
        .boxed_unsync();
    outgoing(
        Request::post("/v1/chat/completions")
            .header("host", "up")
            .body(body)
            .unwrap(),
    )
}

fn get() -> Outgoing {
    let body: ReqBody = Empty::<Bytes>::new()
        .map_err(|e| -> BoxError { match e {} })
        .boxed_unsync();
    outgoing(Request::get("/v1/models").body(body).unwrap())
}

/// Reads one request head (and `body` more bytes) off the upstream's side.
async fn read_request(server: &mut TcpStream, body: usize) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        server.read_exact(&mut byte).await.unwrap();
        got.push(byte[0]);
    }
    let mut rest = vec![0u8; body];
    server.read_exact(&mut rest).await.unwrap();
    got.extend_from_slice(&rest);
    String::from_utf8(got).unwrap()
}

/// Every data frame of `body`, and how it ended.
async fn frames(mut body: RelayBody) -> (Vec<Bytes>, Result<(), String>) {
    let mut out = Vec::new();
    loop {
        match body.frame().await {
            None => return (out, Ok(())),
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    out.push(d);
                }
            }
            Some(Err(e)) => return (out, Err(e.to_string())),
        }
    }
}

fn sent(r: Result<Response<RelayBody>, SendError>) -> Response<RelayBody> {
    match r {
        Ok(r) => r,
        Err(SendError::Unsent(_)) => panic!("unsent"),
        Err(SendError::Failed(e)) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_chunked_stream_is_relayed_and_its_connection_reused() {
    let (conn, mut server) = connected().await;
    let shelf = Arc::new(Shelf::default());
    let fault = BodyFault::default();
    let upstream = tokio::spawn(async move {
        let req = read_request(&mut server, 2).await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        server.write_all(b"6\r\ndata:1\r\n").await.unwrap();
        // Two chunks in one write, then the end split across writes.
        server
            .write_all(b"6\r\ndata:2\r\n6\r\ndata:3\r\n0\r")
            .await
            .unwrap();
        server.write_all(b"\n\r\n").await.unwrap();
        (req, server)
    });
    let resp = sent(send(conn, post("{}"), &fault, shelf.clone(), 64 * 1024).await);
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["transfer-encoding"], "chunked");
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!(end, Ok(()));
    assert_eq!(got.concat(), b"data:1data:2data:3");
    let (req, mut server) = upstream.await.unwrap();
    assert_eq!(
        req,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: up\r\ncontent-length: 2\r\n\r\n{}"
    );
    // Back on the shelf, and good for the next request.
    assert_eq!(shelf.count(), 1);
    let conn = shelf.take().unwrap();
    assert!(conn.idle_state() == Quiet::Silent);
    let upstream = tokio::spawn(async move {
        read_request(&mut server, 0).await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nnext")
            .await
            .unwrap();
        server
    });
    let resp = sent(send(conn, get(), &fault, shelf.clone(), 64 * 1024).await);
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!((got.concat(), end), (b"next".to_vec(), Ok(())));
    assert_eq!(shelf.count(), 1);
    // The upstream closes the idle connection: no longer reusable.
    drop(upstream.await.unwrap());
    let conn = shelf.take().unwrap();
    for _ in 0..200 {
        if conn.idle_state() != Quiet::Silent {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("a closed connection still looks reusable");
}

#[tokio::test]
async fn a_framing_violation_hands_on_what_came_before_and_closes() {
    let (conn, mut server) = connected().await;
    let shelf = Arc::new(Shelf::default());
    let upstream = tokio::spawn(async move {
        read_request(&mut server, 2).await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata:1\r\n6\r\ndata:2XX")
            .await
            .unwrap();
        server
    });
    let resp = sent(
        send(
            conn,
            post("{}"),
            &BodyFault::default(),
            shelf.clone(),
            64 * 1024,
        )
        .await,
    );
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!(got.concat(), b"data:1data:2");
    assert_eq!(end, Err("upstream body framing: chunk_data_end".to_owned()));
    assert_eq!(shelf.count(), 0, "closed, not reused");
    drop(upstream.await.unwrap());
}

#[tokio::test]
async fn a_cut_stream_and_a_close_delimited_body_end_as_they_should() {
    // Cut inside a chunk: an error after the bytes that came.
    let (conn, mut server) = connected().await;
    let shelf = Arc::new(Shelf::default());
    tokio::spawn(async move {
        read_request(&mut server, 0).await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nhalf")
            .await
            .unwrap();
    });
    let resp = sent(send(conn, get(), &BodyFault::default(), shelf.clone(), 64 * 1024).await);
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!(got.concat(), b"half");
    assert_eq!(end, Err("upstream body framing: truncated".to_owned()));
    // No length at all: the body is whatever comes before the close.
    let (conn, mut server) = connected().await;
    tokio::spawn(async move {
        read_request(&mut server, 0).await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\n\r\nall of it")
            .await
            .unwrap();
    });
    let resp = sent(send(conn, get(), &BodyFault::default(), shelf.clone(), 64 * 1024).await);
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!((got.concat(), end), (b"all of it".to_vec(), Ok(())));
    assert_eq!(shelf.count(), 0);
}

#[tokio::test]
async fn bytes_after_the_body_keep_the_connection_from_reuse() {
    let (conn, mut server) = connected().await;
    let shelf = Arc::new(Shelf::default());
    tokio::spawn(async move {
        read_request(&mut server, 0).await;
        server
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n")
            .await
            .unwrap();
        std::future::pending::<()>().await;
    });
    let resp = sent(send(conn, get(), &BodyFault::default(), shelf.clone(), 64 * 1024).await);
    assert_eq!(resp.body().size_hint().exact(), Some(2));
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!((got.concat(), end), (b"ok".to_vec(), Ok(())));
    assert_eq!(shelf.count(), 0);
}

/// A request whose body the client sends slowly, in two pieces of four bytes, the
/// second on demand; the upstream answers after the first piece.
async fn early_answer(
    second_before_the_body: bool,
) -> (
    Response<RelayBody>,
    Arc<Shelf>,
    BodyFault,
    tokio::sync::mpsc::Sender<Bytes>,
) {
    let (conn, mut server) = connected().await;
    let shelf = Arc::new(Shelf::default());
    let fault = BodyFault::default();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
    let body: ReqBody = Slow(rx).boxed_unsync();
    let out = outgoing(
        Request::post("/upload")
            .header("content-length", "8")
            .body(body)
            .unwrap(),
    );
    tx.send(Bytes::from_static(b"1234")).await.unwrap();
    tokio::spawn(async move {
        read_request(&mut server, 4).await;
        server
            .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 3\r\n\r\nbig")
            .await
            .unwrap();
        let mut rest = [0u8; 4];
        let _ = server.read_exact(&mut rest).await;
        std::future::pending::<()>().await;
    });
    let resp = sent(send(conn, out, &fault, shelf.clone(), 64 * 1024).await);
    assert_eq!(resp.status(), 413);
    if second_before_the_body {
        tx.send(Bytes::from_static(b"5678")).await.unwrap();
    }
    (resp, shelf, fault, tx)
}

#[tokio::test]
async fn an_early_answer_is_read_while_the_request_is_still_going_out() {
    // The rest of the request goes out while the answer is read: the connection is in
    // step and goes back to the pool.
    let (resp, shelf, fault, tx) = early_answer(true).await;
    drop(tx);
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!((got.concat(), end), (b"big".to_vec(), Ok(())));
    assert_eq!(shelf.count(), 1);
    // The upstream's clock started with its answer, before the body was complete.
    let mut started = std::pin::pin!(fault.upstream_clock_started());
    assert!(futures_poll(&mut started));
    // The answer ends before the request was written whole: closed, not reused.
    let (resp, shelf, _fault, _tx) = early_answer(false).await;
    let (got, end) = frames(resp.into_body()).await;
    assert_eq!((got.concat(), end), (b"big".to_vec(), Ok(())));
    assert_eq!(shelf.count(), 0);
}

fn futures_poll<F: std::future::Future>(f: &mut Pin<&mut F>) -> bool {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    f.as_mut().poll(&mut cx).is_ready()
}

#[tokio::test]
async fn bad_heads_and_silent_closes_fail_the_request() {
    for (reply, want) in [
        (
            &b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n"[..],
            "Content-Length",
        ),
        (b"NOT HTTP\r\n\r\n", "malformed"),
        (b"HTTP/1.1 200 OK\r\ncontent-le", "before a response head"),
    ] {
        let (conn, mut server) = connected().await;
        tokio::spawn(async move {
            read_request(&mut server, 0).await;
            server.write_all(reply).await.unwrap();
        });
        match send(
            conn,
            get(),
            &BodyFault::default(),
            Arc::new(Shelf::default()),
            64 * 1024,
        )
        .await
        {
            Err(SendError::Failed(e)) => {
                let text = format!("{e}");
                assert!(text.contains(want), "{text}");
                assert_eq!(e.code(), "upstream_failed");
            }
            Err(SendError::Unsent(_)) => panic!("unsent"),
            Ok(_) => panic!("accepted {}", String::from_utf8_lossy(reply)),
        }
    }
}

/// A request body fed from a channel.
struct Slow(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Slow {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        self.0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(http_body::Frame::data(b))))
    }
}
