//! Connections in the pool: an upstream that closes, resets or writes on a connection
//! while it idles there, an answer followed by another nobody asked for, and an answer
//! that comes before the request body was sent.

use bytes::Bytes;

use super::{Case, cases};
use crate::common::fake::{Script, Step};

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst";

/// A correct answer; once the connection idles in the pool, `then`.
fn then_while_idle(then: &[Step]) -> Case {
    let mut steps = vec![Step::Write(Bytes::from_static(OK)), Step::Hold];
    steps.extend_from_slice(then);
    Case::script(Script::new(steps)).whole(200, b"first")
}

fn write(bytes: &'static [u8]) -> Step {
    Step::Write(Bytes::from_static(bytes))
}

cases! {
    /// The control: a connection nothing happened to is reused.
    a_quiet_idle_connection_is_reused => then_while_idle(&[]).reused(),
    an_idle_connection_the_upstream_closed_is_not_reused => then_while_idle(&[Step::Close]),
    an_idle_connection_the_upstream_reset_is_not_reused => then_while_idle(&[Step::Reset]),
    an_idle_connection_with_unsolicited_bytes_is_not_reused =>
        then_while_idle(&[write(b"unsolicited")]),
    /// What some servers send before closing a connection idle for too long.
    an_idle_connection_that_got_a_408_is_not_reused =>
        then_while_idle(&[
            write(b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"),
            Step::Close,
        ]),
    /// A whole answer nobody asked for, waiting to be taken for the next request's.
    an_idle_connection_holding_a_whole_answer_is_not_reused =>
        then_while_idle(&[write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nWRONG")]),
    /// Pipelined in the same write as the answer.
    an_extra_answer_after_a_complete_one_is_not_forwarded =>
        Case::answer(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirstHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nWRONG")
            .whole(200, b"first"),
    /// The upstream refuses the request from its head alone and closes: the client gets
    /// that answer though its body was never sent whole.
    an_answer_before_the_request_body_reaches_the_client =>
        Case::script(Script::new(vec![
            Step::Early,
            write(b"HTTP/1.1 413 Content Too Large\r\nconnection: close\r\ncontent-length: 8\r\n\r\ntoo long"),
        ]))
        .whole(413, b"too long")
        .outcome("client_error"),
}
