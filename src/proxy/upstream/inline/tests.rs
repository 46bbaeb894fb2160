//! Tests of `inline.rs`.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    task::Wake,
};

use super::*;

#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<CountingWaker>, Waker) {
    let count = Arc::new(CountingWaker::default());
    let waker = Waker::from(Arc::clone(&count));
    (count, waker)
}

/// Polls a fresh [`Nudge`] once with `round` (given the round's number, from 1): what
/// the poll gave, how many rounds it took, how many times the task was woken.
fn poll_rounds<T>(
    mut round: impl FnMut(usize, &mut Context<'_>) -> Poll<T>,
) -> (Poll<T>, usize, usize) {
    let (count, task) = counting();
    let mut cx = Context::from_waker(&task);
    let mut rounds = 0;
    let poll = Nudge::new().poll(&mut cx, |cx| {
        rounds += 1;
        round(rounds, cx)
    });
    (poll, rounds, count.0.load(Ordering::SeqCst))
}

#[test]
fn a_wake_while_polling_is_a_second_round_not_a_task_wake() {
    // The first round wakes itself (as the connection wakes the body); the second
    // finds what it was woken for.
    let (poll, rounds, task_wakes) = poll_rounds(|round, cx| {
        if round == 1 {
            cx.waker().wake_by_ref();
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    });
    assert_eq!((poll, rounds, task_wakes), (Poll::Ready(()), 2, 0));
}

#[test]
fn a_wake_from_outside_reaches_the_task() {
    let (count, task) = counting();
    let mut cx = Context::from_waker(&task);
    let mut nudge = Nudge::new();
    let mut registered = None;
    let poll: Poll<()> = nudge.poll(&mut cx, |cx| {
        registered = Some(cx.waker().clone());
        Poll::Pending
    });
    assert!(poll.is_pending());
    assert_eq!(count.0.load(Ordering::SeqCst), 0);
    // As the socket would, later and from another thread.
    let registered = registered.unwrap();
    std::thread::spawn(move || registered.wake())
        .join()
        .unwrap();
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    // A new task takes over (the connection moved to another request).
    let (other, other_task) = counting();
    let mut cx = Context::from_waker(&other_task);
    let waker = nudge.waker.clone();
    let _ = nudge.poll(&mut cx, |_| Poll::<()>::Pending);
    waker.wake_by_ref();
    assert_eq!(other.0.load(Ordering::SeqCst), 1);
    assert_eq!(count.0.load(Ordering::SeqCst), 1);
    // Once forgotten (the connection went back to the pool), nobody is woken.
    nudge.forget();
    waker.wake();
    assert_eq!(other.0.load(Ordering::SeqCst), 1);
}

#[test]
fn endless_wakes_while_polling_yield_after_a_few_rounds() {
    let (poll, rounds, task_wakes) = poll_rounds(|_, cx| {
        cx.waker().wake_by_ref();
        Poll::<()>::Pending
    });
    assert!(poll.is_pending());
    assert_eq!(rounds, ROUNDS);
    // The task is woken to come back after the others had their turn.
    assert_eq!(task_wakes, 1);
}

#[test]
fn the_sweep_drops_closed_connections_and_keeps_open_ones_in_order()
-> Result<(), Box<dyn std::error::Error>> {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0")?;
    let overrides = crate::config::Overrides {
        upstream: Some(format!("http://{}", upstream.local_addr()?)),
        ..Default::default()
    };
    let cfg = crate::config::load(None, &overrides)?;
    let slots = Arc::new(Slots::new(8, Duration::from_secs(1), Default::default()));
    let pool = Pool::for_upstream(&cfg.upstream, slots).ok_or("plain HTTP/1 upstream")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut opened = Vec::new();
        for _ in 0..3 {
            let slot = pool.slots.take().await?;
            opened.push(pool.connect(slot).await?);
        }
        // The upstream closes the first of the three; the other two wait in its backlog.
        let (closed, _) = upstream.accept()?;
        drop(closed);
        let reads: Vec<_> = opened.iter().map(|c| Arc::as_ptr(c.reads())).collect();
        for conn in opened {
            pool.put(conn);
        }
        // Let the runtime's I/O driver see the close.
        tokio::time::sleep(Duration::from_millis(50)).await;
        pool.sweep();
        let left: Vec<_> = pool
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|e| Arc::as_ptr(e.conn.reads()))
            .collect();
        assert_eq!(
            left,
            reads[1..],
            "the closed one dropped, the others kept in order"
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}

#[test]
fn requests_go_out_in_origin_form() {
    let cases = [
        (
            "http://up:8000/v1/chat/completions?a=1",
            "/v1/chat/completions?a=1",
        ),
        ("http://up:8000/", "/"),
        ("http://up:8000", "/"),
    ];
    for (absolute, origin) in cases {
        let uri: Uri = absolute.parse().unwrap();
        assert_eq!(origin_form(&uri).to_string(), origin, "{absolute}");
    }
}

#[test]
fn host_leaves_out_the_default_port() {
    for (authority, host) in [("up:8000", "up:8000"), ("up:80", "up"), ("up", "up")] {
        let authority: Authority = authority.parse().unwrap();
        assert_eq!(host_header(&authority).unwrap(), host);
    }
}

#[test]
fn only_heads_that_mean_what_they_say_to_the_client_are_forwarded() {
    let head = |status: u16, codings: &[&str]| {
        let mut resp = Response::new(());
        *resp.status_mut() = StatusCode::from_u16(status).unwrap();
        for coding in codings {
            resp.headers_mut()
                .append(TRANSFER_ENCODING, HeaderValue::from_str(coding).unwrap());
        }
        forwardable(&resp).is_ok()
    };
    assert!(head(200, &[]));
    assert!(head(200, &["chunked"]));
    assert!(head(200, &["Chunked "]));
    assert!(head(404, &[",chunked,"]));
    // Another coding would reach the client with its name taken off.
    for codings in [
        &["gzip"][..],
        &["identity"],
        &["gzip, chunked"],
        &["chunked, gzip"],
        &["gzip", "chunked"],
        &["chunked", "chunked"],
    ] {
        assert!(!head(200, codings), "{codings:?}");
    }
    // Nothing sent on the pool asks for an upgrade.
    assert!(!head(101, &[]));
}
